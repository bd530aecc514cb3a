// depot_rejoin_worker: one worker of rejoin_test.cc as its own process, which
// the test kills with SIGKILL and starts again.
//
//   depot_rejoin_worker --servers=H:P,H:P --job=NAME --rank=R --seed=S
//       --last_step=T [--die_at_step=K --die_after_us=D]
//
// It rejoins the job (RejoinAndTrain) and trains to step T. With
// --die_at_step, a thread sends the process SIGKILL D microseconds after step
// K's Job::Step begins: the test picks K and D at random, so the kill lands
// before, in the middle of, or after the step's transfers (at the latest
// after step T: the process waits for it). Exit 0 when done,
// 1 on an error (printed on stderr), 2 on a bad command line.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "depot/client.h"
#include "rejoin_worker.h"

int main(int argc, char** argv) {
  std::map<std::string, std::string> flags;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    if (arg.rfind("--", 0) != 0 || eq == std::string::npos) {
      std::fprintf(stderr, "bad argument %s (want --name=value)\n", argv[i]);
      return 2;
    }
    flags[arg.substr(2, eq - 2)] = arg.substr(eq + 1);
  }
  for (const char* required : {"servers", "job", "rank", "seed", "last_step"}) {
    if (flags.count(required) == 0) {
      std::fprintf(stderr, "missing --%s\n", required);
      return 2;
    }
  }
  const uint32_t rank = std::stoul(flags["rank"]);
  const uint64_t seed = std::stoull(flags["seed"]);
  const uint64_t last_step = std::stoull(flags["last_step"]);
  const uint64_t die_at_step =
      flags.count("die_at_step") ? std::stoull(flags["die_at_step"]) : 0;
  const uint64_t die_after_us =
      flags.count("die_after_us") ? std::stoull(flags["die_after_us"]) : 0;

  depot::ClientOptions options;
  options.servers = absl::StrSplit(flags["servers"], ',');
  options.step_timeout = absl::Minutes(1);
  absl::StatusOr<std::unique_ptr<depot::Client>> client =
      depot::Client::Connect(options);
  if (!client.ok()) {
    std::fprintf(stderr, "connect: %s\n", client.status().ToString().c_str());
    return 1;
  }
  if (absl::Status s = (*client)->WaitForServers(absl::Seconds(30)); !s.ok()) {
    std::fprintf(stderr, "servers: %s\n", s.ToString().c_str());
    return 1;
  }
  absl::StatusOr<std::unique_ptr<depot::Job>> job =
      (*client)->OpenJob(depot::testing::RejoinJobConfig(flags["job"]), rank);
  if (!job.ok()) {
    std::fprintf(stderr, "open job: %s\n", job.status().ToString().c_str());
    return 1;
  }
  uint64_t resumed_from = 0;
  std::vector<uint64_t> server_steps;
  const absl::Status s = depot::testing::RejoinAndTrain(
      **job, seed, last_step,
      [&](uint64_t step) {
        if (step != die_at_step) return;
        std::thread([die_after_us] {
          std::this_thread::sleep_for(std::chrono::microseconds(die_after_us));
          kill(getpid(), SIGKILL);
        }).detach();
      },
      &resumed_from, &server_steps);
  if (!s.ok()) {
    std::fprintf(stderr, "worker %u: %s\n", rank, s.ToString().c_str());
    return 1;
  }
  // A kill point after the last step: wait for it, so that every kill point
  // kills.
  if (die_at_step != 0) {
    for (;;) pause();
  }
  // rejoin_test.cc reads this line.
  std::printf(
      "servers at steps %s; worker %u resumed after step %llu and "
      "trained to step %llu\n",
      absl::StrJoin(server_steps, ",").c_str(), rank,
      static_cast<unsigned long long>(resumed_from),
      static_cast<unsigned long long>(last_step));
  return 0;
}
