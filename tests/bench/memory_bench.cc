#include "tests/bench/memory_bench.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "depot/client.h"
#include "depot/dtype.h"
#include "depot/job_config.h"
#include "server_process.h"
#include "tests/bench/bench_output.h"

namespace depot::bench {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;
constexpr int kSteps = 3;

// The server's VmRSS in bytes, from /proc/PID/status.
absl::StatusOr<double> ResidentBytes(pid_t pid) {
  const std::string path = absl::StrCat("/proc/", pid, "/status");
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) != 0) continue;
    std::string digits;
    for (char c : line)
      if (c >= '0' && c <= '9') digits += c;
    uint64_t kib = 0;
    if (absl::SimpleAtoi(digits, &kib)) return kib * 1024.0;
  }
  return absl::InternalError(absl::StrCat("no VmRSS line in ", path));
}

// A loopback port that was free a moment ago (the server binds it next; a
// race with another process is possible but harmless for a benchmark, which
// then fails to start and says so).
absl::StatusOr<int> FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError("socket() failed");
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  const bool ok =
      bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  close(fd);
  if (!ok) return absl::InternalError("could not find a free loopback port");
  return ntohs(addr.sin_port);
}

void PrintPoint(const MemoryBenchOptions& options, DType moments,
                const std::string& point, double rss, double baseline) {
  // The limits: 12 B/param (fp32 master + m + v) or 8 (bf16 m, v),
  // plus 64 MiB; and the bf16 weights every chunk keeps of its last two steps
  // for pulls at a step (2 x 2 B/param, docs/protocol.md "A worker that
  // rejoins"), which the server's budget counts too.
  const double kept_per_param = 2.0 * DTypeSize(DType::kBFloat16);
  const double limit_per_param =
      (moments == DType::kFloat32 ? 12.0 : 8.0) + kept_per_param;
  const double limit = limit_per_param * options.params + 64 * kMiB;
  const double used = rss - baseline;
  ResultLine line;
  line.bench = "memory";
  line.text = {{"moment_dtype", std::string(DTypeName(moments))},
               {"point", point}};
  line.numbers = {{"params", static_cast<double>(options.params)},
                  {"baseline_rss_mib", baseline / kMiB},
                  {"rss_mib", rss / kMiB},
                  {"job_mib", used / kMiB},
                  {"bytes_per_param", used / options.params},
                  {"limit_mib", limit / kMiB},
                  {"ratio", used / limit}};
  line.Print(options.json);
}

absl::Status MeasureOne(const MemoryBenchOptions& options, DType moments) {
  absl::StatusOr<int> port = FreePort();
  if (!port.ok()) return port.status();
  const std::string address = absl::StrCat("127.0.0.1:", *port);
  absl::StatusOr<std::unique_ptr<testing::ServerProcess>> server =
      testing::ServerProcess::Spawn(
          options.server,
          {absl::StrCat("--listen=", address), "--metrics_listen=127.0.0.1:0"});
  if (!server.ok()) return server.status();
  ClientOptions client_options;
  client_options.servers = {address};
  absl::StatusOr<std::unique_ptr<Client>> client =
      Client::Connect(client_options);
  if (!client.ok()) return client.status();
  if (absl::Status s = (*client)->WaitForServers(absl::Seconds(60)); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(s.message(), "; server log:\n",
                                               (*server)->Log()));
  }
  absl::StatusOr<double> baseline = ResidentBytes((*server)->pid());
  if (!baseline.ok()) return baseline.status();

  JobConfig config;
  config.name = absl::StrCat("memory-bench-", std::string(DTypeName(moments)));
  config.tensors = {{"w", options.params, 0}};
  config.optimizer.kind = OptimizerKind::kAdamW;
  config.optimizer.exp_avg_dtype = moments;
  config.optimizer.exp_avg_sq_dtype = moments;
  config.grad_dtype = DType::kBFloat16;
  config.weight_dtype = DType::kBFloat16;
  absl::StatusOr<std::unique_ptr<Job>> job = (*client)->OpenJob(config, 0);
  if (!job.ok()) return job.status();
  absl::StatusOr<double> created = ResidentBytes((*server)->pid());
  if (!created.ok()) return created.status();
  PrintPoint(options, moments, "after_create", *created, *baseline);

  // Step reads and writes the job's whole flat layout, tensors padded.
  const uint64_t n = (*job)->total_elems();
  const std::vector<uint16_t> grads(n, FloatToBFloat16(1e-3f));
  std::vector<uint16_t> weights(n);
  for (uint64_t step = 1; step <= kSteps; ++step) {
    if (absl::Status s =
            (*job)->Step(step, grads.data(), weights.data(), nullptr);
        !s.ok()) {
      return s;
    }
  }
  absl::StatusOr<double> stepped = ResidentBytes((*server)->pid());
  if (!stepped.ok()) return stepped.status();
  PrintPoint(options, moments, "after_3_steps", *stepped, *baseline);
  return absl::OkStatus();
}

}  // namespace

absl::Status RunMemoryBench(const MemoryBenchOptions& options) {
  if (options.params == 0)
    return absl::InvalidArgumentError("--params must be positive");
  for (DType moments : {DType::kFloat32, DType::kBFloat16}) {
    // Each measurement in its own child process, the first to use gRPC, so
    // that the first job's server and client leave nothing behind.
    std::fflush(stdout);
    const pid_t child = fork();
    if (child < 0) return absl::InternalError("fork() failed");
    if (child == 0) {
      const absl::Status s = MeasureOne(options, moments);
      if (!s.ok()) std::fprintf(stderr, "%s\n", s.ToString().c_str());
      std::fflush(nullptr);
      _exit(s.ok() ? 0 : 1);
    }
    int wstatus = 0;
    if (waitpid(child, &wstatus, 0) != child)
      return absl::InternalError("waitpid() failed");
    if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0) {
      return absl::InternalError(
          absl::StrCat("the ", std::string(DTypeName(moments)),
                       " moments measurement failed (its error is above)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace depot::bench
