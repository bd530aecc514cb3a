#include "tests/bench/step_bench.h"

#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "depot/client.h"
#include "depot/dtype.h"
#include "depot/job_config.h"
#include "prometheus/registry.h"
#include "server/job_store.h"
#include "server/metrics.h"
#include "server/shard_state.h"
#include "server/step_reply_sink.h"
#include "server/thread_pool.h"
#include "server_process.h"
#include "tests/bench/bench_output.h"
#include "tests/bench/netns.h"

ABSL_FLAG(uint64_t, step_params, 100'000'000,
          "step: parameters of the model (one bf16 tensor, AdamW, fp32 "
          "moments).");
ABSL_FLAG(int32_t, step_repeats, 5,
          "step: rounds of (step, transfer alone, serial baseline, update "
          "alone); medians are reported.");
ABSL_FLAG(std::string, step_link, "veth",
          "step: veth (the servers in their own network namespace behind a "
          "veth pair shaped by tc to --step_rate; needs root, else falls back "
          "to loopback with a note) or loopback (unshaped).");
ABSL_FLAG(std::string, step_rate, "10gbit",
          "step: the veth link's rate in each direction, as tc writes it "
          "(e.g. 10gbit, 2500mbit).");
ABSL_FLAG(int32_t, step_threads, 0,
          "step: update threads of the servers and of the in-process update "
          "(0: one per hardware thread, the server's default).");

namespace depot::bench {
namespace {

// How long the raw TCP stream measuring the link runs, each direction.
constexpr absl::Duration kLinkProbeTime = absl::Seconds(1);
// Fixed ports are safe inside the private namespace: nothing else is there.
constexpr int kStepPort = 50051;
constexpr int kNoopPort = 50052;

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

// Where the servers run and what the link between them and the client is.
struct LinkSetup {
  std::unique_ptr<ShapedLink> veth;  // null: loopback
  std::string rate = "unshaped";
  std::string note;           // why veth fell back to loopback
  double out_bits_per_s = 0;  // raw TCP, client side -> server side
  double in_bits_per_s = 0;   // raw TCP, server side -> client side
  std::string name() const { return veth ? "veth" : "loopback"; }
};

// The job all three kinds of step use: the configuration.
JobConfig BenchJobConfig(const std::string& name, uint64_t params) {
  JobConfig config;
  config.name = name;
  config.tensors = {{"w", params, 0}};
  config.optimizer.kind = OptimizerKind::kAdamW;
  config.grad_dtype = DType::kBFloat16;
  config.weight_dtype = DType::kBFloat16;
  return config;
}

// A depot-server child and its address.
struct RunningServer {
  std::unique_ptr<testing::ServerProcess> process;
  std::string address;
};

absl::StatusOr<RunningServer> StartServer(const LinkSetup& link, int port,
                                          int threads, bool noop) {
  std::vector<std::string> flags = {absl::StrCat("--threads=", threads)};
  if (noop) flags.push_back("--bench_noop_update");
  RunningServer server;
  if (link.veth == nullptr) {
    absl::StatusOr<std::unique_ptr<testing::ServerProcess>> process =
        testing::ServerProcess::Start(flags);
    if (!process.ok()) return process.status();
    server.address = (*process)->grpc_address();
    server.process = *std::move(process);
    return server;
  }
  // `ip netns exec` execs the server in place, so the child is the server.
  std::vector<std::string> argv = link.veth->ExecPrefix();
  server.address = absl::StrCat(link.veth->inner_address(), ":", port);
  argv.push_back(testing::ServerProcess::DefaultBinary());
  argv.push_back(absl::StrCat("--listen=", server.address));
  argv.push_back("--metrics_listen=127.0.0.1:0");
  argv.insert(argv.end(), flags.begin(), flags.end());
  const std::string binary = argv.front();
  argv.erase(argv.begin());
  absl::StatusOr<std::unique_ptr<testing::ServerProcess>> process =
      testing::ServerProcess::Spawn(binary, argv);
  if (!process.ok()) return process.status();
  server.process = *std::move(process);
  return server;
}

// A Client of one server, and a job on it.
struct Connection {
  std::unique_ptr<Client> client;
  std::vector<std::unique_ptr<Job>> jobs;
};

absl::StatusOr<Connection> Connect(const RunningServer& server) {
  ClientOptions options;
  options.servers = {server.address};
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  if (!client.ok()) return client.status();
  if (absl::Status s = (*client)->WaitForServers(absl::Seconds(60)); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(s.message(), "; server log:\n",
                                               server.process->Log()));
  }
  Connection connection;
  connection.client = *std::move(client);
  return connection;
}

absl::StatusOr<Job*> OpenJob(Connection& connection, const JobConfig& config) {
  absl::StatusOr<std::unique_ptr<Job>> job =
      connection.client->OpenJob(config, 0);
  if (!job.ok()) return job.status();
  connection.jobs.push_back(*std::move(job));
  return connection.jobs.back().get();
}

// Takes the update path's weights and throws them away, counting chunks.
class DiscardingSink : public StepReplySink {
 public:
  void Deliver(ChunkWeights) override {
    absl::MutexLock lock(&mu_);
    ++delivered_;
    delivered_cv_.SignalAll();
  }
  void DeliverAck(uint64_t) override {}
  void DeliverGradStats(const GradStats&) override {}
  bool IsOpen() const override { return true; }

  void WaitForChunks(uint64_t chunks) {
    absl::MutexLock lock(&mu_);
    while (delivered_ < chunks) delivered_cv_.Wait(&mu_);
  }

 private:
  absl::Mutex mu_;
  absl::CondVar delivered_cv_;
  uint64_t delivered_ ABSL_GUARDED_BY(mu_) = 0;
};

// The server's update path in this process, with no transfer: the job's
// ShardState, made by a JobStore as the server makes it, fed one worker's
// contributions for every chunk, through the public API only.
class UpdateAlone {
 public:
  static absl::StatusOr<std::unique_ptr<UpdateAlone>> Create(
      const JobConfig& config, int threads) {
    std::unique_ptr<UpdateAlone> update(new UpdateAlone(threads));
    absl::StatusOr<OpenedJob> job = update->jobs_.CreateOrAttach(config, 0);
    if (!job.ok()) return job.status();
    update->shard_ = job->shard;
    return update;
  }

  // Copies step `step`'s gradients (the whole flat buffer, grad dtype) into
  // one contribution per chunk, as the server receives them.
  void Prepare(uint64_t step, const void* grads) {
    const JobShape& shape = shard_->shape();
    const ShardRange& range = shape.shard();
    const size_t elem_bytes = DTypeSize(shape.config().grad_dtype);
    step_ = step;
    sink_ = std::make_shared<DiscardingSink>();
    contributions_.clear();
    for (uint64_t c = range.first_chunk; c < range.end_chunk; ++c) {
      const ChunkRange chunk = shape.plan().chunk(c);
      Contribution contribution;
      contribution.step = step;
      contribution.chunk_index = c;
      contribution.payload.assign(
          static_cast<const char*>(grads) + chunk.begin * elem_bytes,
          chunk.size() * elem_bytes);
      contribution.sink = sink_;
      contributions_.push_back(std::move(contribution));
    }
  }

  // Feeds the prepared contributions and returns once every chunk is applied.
  absl::Status Run() {
    if (absl::Status s = shard_->BeginStep(step_, 0, {}); !s.ok()) return s;
    for (Contribution& contribution : contributions_) {
      if (absl::Status s = shard_->Contribute(std::move(contribution));
          !s.ok()) {
        return s;
      }
    }
    sink_->WaitForChunks(shard_->shape().shard().num_chunks());
    if (shard_->completed_step() != step_) {
      return absl::InternalError(absl::StrCat("update alone: completed step ",
                                              shard_->completed_step(),
                                              " after step ", step_));
    }
    return absl::OkStatus();
  }

 private:
  // No memory budget: the servers' own checks apply to the other stages.
  explicit UpdateAlone(int threads)
      : metrics_(registry_),
        pool_(std::make_unique<ThreadPool>(threads)),
        jobs_(std::numeric_limits<uint64_t>::max(), pool_.get(), &metrics_) {}

  prometheus::Registry registry_;
  ServerMetrics metrics_;
  // Destroyed after the store and the shard: it runs what is queued and joins
  // before the metrics go.
  std::unique_ptr<ThreadPool> pool_;
  JobStore jobs_;
  std::shared_ptr<ShardState> shard_;
  uint64_t step_ = 0;
  std::shared_ptr<DiscardingSink> sink_;
  std::vector<Contribution> contributions_;
};

// One Job::Step, checked to be the kind of step it should be.
absl::Status CheckedStep(Job& job, uint64_t step, const void* grads,
                         void* weights, bool two_phase) {
  StepResult result;
  if (absl::Status s = job.Step(step, grads, weights, &result); !s.ok())
    return s;
  if (result.two_phase != two_phase || result.skipped ||
      result.clip_coef != 1.0 || result.chunks != job.plan().num_chunks()) {
    return absl::InternalError(
        absl::StrCat("job ", job.config().name, " step ", step, ": two_phase ",
                     result.two_phase, ", skipped ", result.skipped,
                     ", clip_coef ", result.clip_coef, ", chunks ",
                     result.chunks, " of ", job.plan().num_chunks()));
  }
  return absl::OkStatus();
}

// One stage's rounds: the wall time of each, and the CPU time this process
// and (when it has one) the stage's server spent in it. The CPU time shows
// how far the stages can overlap on the machine's cores.
class Stage {
 public:
  explicit Stage(pid_t server) : server_(server) {}

  // Runs `body`; records its times when `keep` (not for the warm-up).
  absl::Status Time(bool keep, const std::function<absl::Status()>& body) {
    const double cpu_before = Cpu();
    const auto start = std::chrono::steady_clock::now();
    if (absl::Status s = body(); !s.ok()) return s;
    const double wall = SecondsSince(start);
    if (keep) {
      wall_.push_back(wall);
      cpu_.push_back(Cpu() - cpu_before);
    }
    return absl::OkStatus();
  }

  double wall() const { return Median(wall_); }
  double cpu() const { return Median(cpu_); }

 private:
  double Cpu() const {
    return ProcessCpuSeconds(getpid()) +
           (server_ > 0 ? ProcessCpuSeconds(server_) : 0.0);
  }

  const pid_t server_;
  std::vector<double> wall_, cpu_;
};

// `text` fit for a ResultLine string field, which is printed unescaped into
// JSON: one line, no quotes or backslashes.
std::string PlainText(std::string text) {
  for (char& c : text) {
    if (c == '"') c = '\'';
    if (c == '\\') c = '/';
    if (static_cast<unsigned char>(c) < 0x20) c = ' ';
  }
  return text;
}

// Small nonzero bf16 gradients of both signs.
std::vector<uint16_t> MakeGradients(uint64_t n) {
  std::vector<uint16_t> grads(n);
  uint32_t state = 12345;
  for (uint64_t i = 0; i < n; ++i) {
    state = state * 1664525u + 1013904223u;
    const float value =
        (static_cast<float>(state >> 8) / 16777216.0f - 0.5f) * 1e-2f;
    grads[i] = FloatToBFloat16(value == 0.0f ? 1e-4f : value);
  }
  return grads;
}

// The cores this process may run on: all four stages share them.
int UsableCores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

// Everything that talks gRPC or holds the servers: runs in a child process
// (see RunStepBench) and prints the result line.
absl::Status MeasureSteps(const StepBenchOptions& options,
                          const LinkSetup& link) {
  const int threads =
      options.threads > 0
          ? options.threads
          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  // Declared first, destroyed last: after the clients and jobs.
  absl::StatusOr<RunningServer> step_server =
      StartServer(link, kStepPort, threads, false);
  if (!step_server.ok()) return step_server.status();
  absl::StatusOr<RunningServer> noop_server =
      StartServer(link, kNoopPort, threads, true);
  if (!noop_server.ok()) return noop_server.status();
  absl::StatusOr<Connection> step_conn = Connect(*step_server);
  if (!step_conn.ok()) return step_conn.status();
  absl::StatusOr<Connection> noop_conn = Connect(*noop_server);
  if (!noop_conn.ok()) return noop_conn.status();

  const JobConfig config = BenchJobConfig("step-bench", options.params);
  JobConfig serial_config = BenchJobConfig("step-bench-serial", options.params);
  // Clipping makes the client run two phases; the norm never reaches 1e30.
  serial_config.optimizer.clip_grad = 1e30;
  absl::StatusOr<Job*> step_job = OpenJob(*step_conn, config);
  if (!step_job.ok()) return step_job.status();
  absl::StatusOr<Job*> serial_job = OpenJob(*step_conn, serial_config);
  if (!serial_job.ok()) return serial_job.status();
  absl::StatusOr<Job*> xfer_job = OpenJob(*noop_conn, config);
  if (!xfer_job.ok()) return xfer_job.status();
  absl::StatusOr<std::unique_ptr<UpdateAlone>> update =
      UpdateAlone::Create(config, threads);
  if (!update.ok()) return update.status();

  const uint64_t n = (*step_job)->total_elems();
  const std::vector<uint16_t> grads = MakeGradients(n);
  std::vector<uint16_t> weights(n);
  Stage step(step_server->process->pid());
  Stage xfer(noop_server->process->pid());
  Stage serial(step_server->process->pid());
  Stage update_alone(-1);
  // Step 1 of each is the warm-up (first touch of buffers and connections);
  // the rounds interleave the four so that the machine's noise falls on all.
  for (uint64_t s = 1; s <= static_cast<uint64_t>(options.repeats) + 1; ++s) {
    const bool keep = s > 1;
    absl::Status status = step.Time(keep, [&] {
      return CheckedStep(**step_job, s, grads.data(), weights.data(), false);
    });
    if (!status.ok()) return status;
    status = xfer.Time(keep, [&] {
      return CheckedStep(**xfer_job, s, grads.data(), weights.data(), false);
    });
    if (!status.ok()) return status;
    // The no-op server answers each chunk with the gradient payload: anything
    // else means the transfer-alone server ran real updates.
    if (std::memcmp(weights.data(), grads.data(),
                    options.params * sizeof(uint16_t)) != 0) {
      return absl::InternalError(
          "the --bench_noop_update server did not echo the gradients");
    }
    status = serial.Time(keep, [&] {
      return CheckedStep(**serial_job, s, grads.data(), weights.data(), true);
    });
    if (!status.ok()) return status;
    (*update)->Prepare(s, grads.data());
    status = update_alone.Time(keep, [&] { return (*update)->Run(); });
    if (!status.ok()) return status;
  }

  const double grad_bytes = static_cast<double>(n) * sizeof(uint16_t);
  const int cores = UsableCores();
  ResultLine line;
  line.bench = "step";
  line.text = {{"link", link.name()}, {"rate", link.rate}};
  if (!link.note.empty()) line.text.push_back({"note", PlainText(link.note)});
  line.text.push_back(
      {"serial_baseline",
       "two-phase step: every chunk pushed and summed, then updated; the "
       "pull overlaps the update as chunks finish (so it is, if anything, "
       "faster than fully serial)"});
  line.numbers = {
      {"params", static_cast<double>(options.params)},
      {"repeats", static_cast<double>(options.repeats)},
      {"threads", static_cast<double>(threads)},
      {"cores", static_cast<double>(cores)},
      {"chunks", static_cast<double>((*step_job)->plan().num_chunks())},
      {"link_out_gbit_per_s", link.out_bits_per_s / 1e9},
      {"link_in_gbit_per_s", link.in_bits_per_s / 1e9},
      {"step_s", step.wall()},
      {"xfer_s", xfer.wall()},
      {"update_s", update_alone.wall()},
      {"serial_s", serial.wall()},
      // Payload each way during the transfer alone, against the link columns.
      {"xfer_gbit_per_s", grad_bytes * 8 / xfer.wall() / 1e9},
      // CPU seconds (client + server) of each; the transfer's and the
      // update's together, spread over every core, bound how fast a step
      // that overlaps them can be on this machine.
      {"step_cpu_s", step.cpu()},
      {"xfer_cpu_s", xfer.cpu()},
      {"update_cpu_s", update_alone.cpu()},
      {"serial_cpu_s", serial.cpu()},
      {"cpu_floor_s", (xfer.cpu() + update_alone.cpu()) / cores},
      {"ratio", step.wall() / std::max(xfer.wall(), update_alone.wall())},
      {"speedup", serial.wall() / step.wall()},
  };
  line.Print(options.json);
  return absl::OkStatus();
}

// The veth link (or loopback with a note) and its raw TCP rate each way.
absl::StatusOr<LinkSetup> SetUpLink(const StepBenchOptions& options) {
  LinkSetup link;
  if (options.link == "veth") {
    absl::StatusOr<std::unique_ptr<ShapedLink>> veth =
        ShapedLink::Create(options.rate);
    if (veth.ok()) {
      link.veth = *std::move(veth);
      link.rate = options.rate;
    } else {
      link.note = absl::StrCat("no shaped veth link (", veth.status().message(),
                               "): measured over unshaped loopback");
      std::fprintf(stderr, "depot-bench step: NOTE: %s\n", link.note.c_str());
    }
  }
  TcpEndpoint client_side{"", "127.0.0.1"};
  TcpEndpoint server_side = client_side;
  if (link.veth != nullptr) {
    client_side.address = link.veth->outer_address();
    server_side = {link.veth->netns(), link.veth->inner_address()};
  }
  absl::StatusOr<double> out =
      MeasureTcpStream(client_side, server_side, kLinkProbeTime);
  if (!out.ok()) return out.status();
  absl::StatusOr<double> in =
      MeasureTcpStream(server_side, client_side, kLinkProbeTime);
  if (!in.ok()) return in.status();
  link.out_bits_per_s = *out;
  link.in_bits_per_s = *in;
  return link;
}

// SIGINT, SIGTERM or SIGHUP, blocked while the bench runs and read from a
// signalfd, so that the link is torn down whenever the run ends.
class StopSignals {
 public:
  StopSignals() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGINT);
    sigaddset(&set_, SIGTERM);
    sigaddset(&set_, SIGHUP);
    sigprocmask(SIG_BLOCK, &set_, &old_);
    fd_ = signalfd(-1, &set_, SFD_CLOEXEC | SFD_NONBLOCK);
  }
  ~StopSignals() {
    // A signal still pending would act as soon as it is unblocked.
    while (Received() != 0) {
    }
    if (fd_ >= 0) close(fd_);
    sigprocmask(SIG_SETMASK, &old_, nullptr);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  int fd() const { return fd_; }
  const sigset_t& old_mask() const { return old_; }
  // The signal received (consumed), or 0.
  int Received() {
    signalfd_siginfo info;
    if (fd_ >= 0 && read(fd_, &info, sizeof(info)) == sizeof(info))
      return static_cast<int>(info.ssi_signo);
    return 0;
  }

 private:
  sigset_t set_;
  sigset_t old_;
  int fd_ = -1;
};

absl::Status Interrupted(int signal_number) {
  return absl::CancelledError(absl::StrCat(
      "interrupted by signal ", signal_number, " (", strsignal(signal_number),
      "); the servers and the link are gone"));
}

// Runs MeasureSteps in a child process and waits for it or a stop signal.
// The child holds every thread gRPC starts and every server (they die with it:
// PR_SET_PDEATHSIG), and its temp files live in `temp_dir`; this process
// stays single-threaded and can always tear the link down.
absl::Status RunMeasurementChild(const StepBenchOptions& options,
                                 const LinkSetup& link, StopSignals& signals,
                                 const std::string& temp_dir) {
  std::fflush(nullptr);
  const pid_t parent = getpid();
  const pid_t child = fork();
  if (child < 0) return absl::InternalError("fork() failed");
  if (child == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    sigprocmask(SIG_SETMASK, &signals.old_mask(), nullptr);
    // ServerProcess puts its temp dirs under $TMPDIR.
    setenv("TMPDIR", temp_dir.c_str(), 1);
    const absl::Status s = MeasureSteps(options, link);
    if (!s.ok())
      std::fprintf(stderr, "depot-bench step: %s\n", s.ToString().c_str());
    std::fflush(nullptr);
    _exit(s.ok() ? 0 : 1);
  }
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, child, 0));
  int signal_number = 0;
  bool exited = false;
  while (pidfd >= 0 && !exited && signal_number == 0) {
    pollfd fds[2] = {{signals.fd(), POLLIN, 0}, {pidfd, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0 && errno != EINTR) break;
    signal_number = signals.Received();
    exited = fds[1].revents != 0;
  }
  if (signal_number != 0 || !exited) kill(child, SIGKILL);
  int status = 0;
  while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  if (pidfd >= 0) close(pidfd);
  if (signal_number != 0) return Interrupted(signal_number);
  if (!exited) {
    return absl::InternalError(
        "could not wait for the measurement process (pidfd_open or poll)");
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return absl::OkStatus();
  return absl::InternalError(
      "the step measurement failed (its error is above)");
}

}  // namespace

absl::Status RunStepBench(const StepBenchOptions& options) {
  if (options.params == 0 || options.repeats < 1 || options.threads < 0) {
    return absl::InvalidArgumentError(
        "--step_params and --step_repeats must be positive, --step_threads "
        ">= 0");
  }
  if (options.link != "veth" && options.link != "loopback") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--step_link=", options.link, " is not one of veth, loopback"));
  }
  if (absl::StatusOr<double> rate = ParseLinkRate(options.rate); !rate.ok())
    return rate.status();

  StopSignals signals;
  if (signals.fd() < 0) return absl::InternalError("signalfd() failed");
  std::string temp_dir = "/tmp/depot-step-bench.XXXXXX";
  if (const char* tmp = std::getenv("TMPDIR"); tmp != nullptr && *tmp != '\0')
    temp_dir = absl::StrCat(tmp, "/depot-step-bench.XXXXXX");
  if (mkdtemp(temp_dir.data()) == nullptr)
    return absl::InternalError(absl::StrCat("mkdtemp ", temp_dir, " failed"));
  // The link lives in this lambda: its destructor tears the veth pair and
  // the namespace down on every way out.
  absl::Status status = [&]() -> absl::Status {
    absl::StatusOr<LinkSetup> link = SetUpLink(options);
    if (!link.ok()) return link.status();
    // A signal during the setup is acted on only now, with the link known.
    if (const int signal_number = signals.Received(); signal_number != 0)
      return Interrupted(signal_number);
    return RunMeasurementChild(options, *link, signals, temp_dir);
  }();
  std::error_code ignored;
  std::filesystem::remove_all(temp_dir, ignored);
  return status;
}

absl::Status RunStepCommand(bool json) {
  StepBenchOptions options;
  options.params = absl::GetFlag(FLAGS_step_params);
  options.repeats = absl::GetFlag(FLAGS_step_repeats);
  options.link = absl::GetFlag(FLAGS_step_link);
  options.rate = absl::GetFlag(FLAGS_step_rate);
  options.threads = absl::GetFlag(FLAGS_step_threads);
  options.json = json;
  return RunStepBench(options);
}

}  // namespace depot::bench
