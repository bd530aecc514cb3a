#include "tests/bench/transport_bench.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "depot/client.h"
#include "depot/job_config.h"
#include "server/daemon.h"
#include "server/server_options.h"
#include "server/tenant_auth.h"
#include "tests/bench/bench_output.h"
#include "wire/transport_memory.h"

ABSL_FLAG(uint64_t, transport_params, uint64_t{64} << 20,
          "transport: parameters per step; each step pushes them as bf16 "
          "gradients and pulls them back as bf16 weights");
ABSL_FLAG(uint64_t, transport_chunk_elems, depot::kDefaultChunkElems,
          "transport: elements per chunk, for Depot and for raw TCP alike");
ABSL_FLAG(int, transport_connections,
          depot::ClientOptions().connections_per_server,
          "transport: Depot's TCP connections to the server "
          "(ClientOptions::connections_per_server)");
ABSL_FLAG(int, transport_inflight, depot::ClientOptions().max_inflight_chunks,
          "transport: chunks in flight per stream (Depot's "
          "max_inflight_chunks; the raw TCP socket's window too)");
ABSL_FLAG(int, transport_raw_connections, 1,
          "transport: TCP socket pairs of the raw baseline, each carrying a "
          "contiguous part of the chunks");
ABSL_FLAG(int, transport_repeats, 5,
          "transport: rounds of each (Depot, raw, Depot, raw, ...); the "
          "medians are reported");
ABSL_FLAG(int, transport_steps, 2, "transport: steps timed per round");

namespace depot::bench {
namespace {

// Gradients and weights are bf16: 2 bytes per element each way.
constexpr size_t kElemBytes = 2;

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

absl::Status ErrnoError(const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

// Writes all of `iov` (modified on the way); false on error.
bool WriteAll(int fd, iovec* iov, int count) {
  while (count > 0) {
    const ssize_t n = writev(fd, iov, count);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    size_t left = static_cast<size_t>(n);
    while (count > 0 && left >= iov->iov_len) {
      left -= iov->iov_len;
      ++iov;
      --count;
    }
    if (count > 0) {
      iov->iov_base = static_cast<char*>(iov->iov_base) + left;
      iov->iov_len -= left;
    }
  }
  return true;
}

// Reads exactly `size` bytes; false on error or end of stream.
bool ReadAll(int fd, void* out, size_t size) {
  char* dst = static_cast<char*>(out);
  while (size > 0) {
    const ssize_t n = read(fd, dst, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    dst += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

// A raw chunk on the socket: its payload size (8 bytes, host order: both ends
// are this program) and the payload.
bool WriteFrame(int fd, const char* payload, uint64_t size) {
  iovec iov[2] = {{&size, sizeof(size)},
                  {const_cast<char*>(payload), static_cast<size_t>(size)}};
  return WriteAll(fd, iov, 2);
}

void SetNoDelay(int fd) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// --------------------------------------------------------------- the child

// The raw baseline's server side of one connection: a reader thread reads
// each chunk into a buffer and a writer thread writes an equal-size chunk
// back (the same bytes, as Depot's no-op server echoes the gradients), full
// duplex. Buffers are recycled; the client's window bounds how many exist.
void EchoConnection(int fd) {
  absl::Mutex mu;
  std::deque<std::string> ready;  // read, to be written back
  std::vector<std::string> free;  // written back, to be reused
  bool reads_done = false;
  std::thread writer([&] {
    while (true) {
      std::string chunk;
      {
        absl::MutexLock lock(&mu);
        auto has_work = [&] { return !ready.empty() || reads_done; };
        mu.Await(absl::Condition(&has_work));
        if (ready.empty()) return;
        chunk = std::move(ready.front());
        ready.pop_front();
      }
      if (!WriteFrame(fd, chunk.data(), chunk.size())) return;
      absl::MutexLock lock(&mu);
      free.push_back(std::move(chunk));
    }
  });
  while (true) {
    uint64_t size = 0;
    if (!ReadAll(fd, &size, sizeof(size))) break;
    std::string chunk;
    {
      absl::MutexLock lock(&mu);
      if (!free.empty()) {
        chunk = std::move(free.back());
        free.pop_back();
      }
    }
    chunk.resize(size);
    if (!ReadAll(fd, chunk.data(), size)) break;
    absl::MutexLock lock(&mu);
    ready.push_back(std::move(chunk));
  }
  {
    absl::MutexLock lock(&mu);
    reads_done = true;
  }
  writer.join();
  close(fd);
}

// The secured server's credentials, made for this run by the openssl
// command-line tool in a temp dir (no key is kept anywhere): a CA, a server
// certificate for 127.0.0.1 that it signed, and a token file.
struct TlsFiles {
  std::string dir;
  std::string ca, cert, key, token_file;
  std::string token = "transport-bench-token";
};

absl::StatusOr<TlsFiles> MakeTlsFiles() {
  TlsFiles files;
  std::string pattern =
      (std::filesystem::temp_directory_path() / "depot-bench-tls.XXXXXX")
          .string();
  if (mkdtemp(pattern.data()) == nullptr) return ErrnoError("mkdtemp");
  files.dir = pattern;
  files.ca = files.dir + "/ca.pem";
  files.cert = files.dir + "/server.pem";
  files.key = files.dir + "/server.key";
  files.token_file = files.dir + "/tokens";
  std::ofstream(files.dir + "/san.ext")
      << "subjectAltName=IP:127.0.0.1,DNS:localhost\n";
  const std::string commands = absl::StrCat(
      "cd '", files.dir, "' && (",
      "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 "
      "-nodes -days 1 -subj /CN=bench-ca -keyout ca.key -out ca.pem && ",
      "openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
      "-subj /CN=localhost -keyout server.key -out server.csr && ",
      "openssl x509 -req -days 1 -in server.csr -CA ca.pem -CAkey ca.key "
      "-CAcreateserial -extfile san.ext -out server.pem",
      ") >openssl.log 2>&1");
  if (std::system(commands.c_str()) != 0) {
    std::filesystem::remove_all(files.dir);
    return absl::FailedPreconditionError(
        "transport: the openssl command-line tool could not make the TLS "
        "certificates of the TLS measurement (is openssl installed?)");
  }
  std::ofstream(files.token_file) << "bench " << Sha256Hex(files.token) << "\n";
  return files;
}

// A no-op server on a free loopback port; with `tls`, TLS and the token.
absl::StatusOr<std::unique_ptr<DepotDaemon>> StartBenchServer(
    const TlsFiles* tls) {
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.metrics_listen = "";
  options.threads = 1;  // no-op updates need no pool
  options.shutdown_grace = absl::Seconds(1);
  options.bench_noop_update = true;
  if (tls != nullptr) {
    options.tls_cert = tls->cert;
    options.tls_key = tls->key;
    options.auth_token_file = tls->token_file;
  }
  absl::StatusOr<ServerOptions> resolved = ResolveServerOptions(options);
  if (!resolved.ok()) return resolved.status();
  return DepotDaemon::Start(*resolved);
}

// The child: the real servers (in-process DepotDaemons, no-op updates; one
// plaintext, one with TLS and a token) and the raw TCP endpoint. Reports
// "grpc_address raw_port tls_address\n" on `report_fd`, then serves until
// `control_fd` reaches end of file (the parent is done or gone).
int RunServerChild(int control_fd, int report_fd, const TlsFiles& tls) {
  RetainTransportBuffers();  // as depot-server's main does
  absl::StatusOr<std::unique_ptr<DepotDaemon>> daemon =
      StartBenchServer(nullptr);
  if (!daemon.ok()) {
    std::fprintf(stderr, "transport server: %s\n",
                 daemon.status().ToString().c_str());
    return 1;
  }
  absl::StatusOr<std::unique_ptr<DepotDaemon>> tls_daemon =
      StartBenchServer(&tls);
  if (!tls_daemon.ok()) {
    std::fprintf(stderr, "transport server (TLS): %s\n",
                 tls_daemon.status().ToString().c_str());
    return 1;
  }

  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  if (listener < 0 ||
      bind(listener, reinterpret_cast<sockaddr*>(&address), length) != 0 ||
      listen(listener, 16) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length) !=
          0) {
    std::perror("transport server: raw listener");
    return 1;
  }
  std::vector<std::thread> connections;
  std::thread acceptor([&] {
    while (true) {
      const int fd = accept(listener, nullptr, nullptr);
      if (fd < 0) {
        if (errno == EINTR) continue;
        return;  // the listener was shut down
      }
      SetNoDelay(fd);
      connections.emplace_back(EchoConnection, fd);
    }
  });

  const std::string report =
      absl::StrCat((*daemon)->address(), " ", ntohs(address.sin_port), " ",
                   (*tls_daemon)->address(), "\n");
  bool reported = write(report_fd, report.data(), report.size()) ==
                  static_cast<ssize_t>(report.size());
  close(report_fd);
  char byte;
  while (reported) {  // until end of file (or an error)
    const ssize_t n = read(control_fd, &byte, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
  }
  (*daemon)->Shutdown();
  (*tls_daemon)->Shutdown();
  shutdown(listener, SHUT_RDWR);
  acceptor.join();
  close(listener);
  // The parent closed its raw sockets before its end of the control pipe.
  for (std::thread& connection : connections) connection.join();
  return reported ? 0 : 1;
}

// -------------------------------------------------------------- the parent

struct ServerChild {
  pid_t pid = -1;
  int control_fd = -1;  // closing it tells the child to exit
  std::string grpc_address;
  int raw_port = 0;
  std::string tls_address;  // the server with TLS and a token
};

absl::StatusOr<ServerChild> StartServerChild(const TlsFiles& tls) {
  int control[2];
  int report[2];
  if (pipe2(control, O_CLOEXEC) != 0 || pipe2(report, O_CLOEXEC) != 0) {
    return ErrnoError("pipe");
  }
  std::fflush(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return ErrnoError("fork");
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);  // the parent died before prctl
    close(control[1]);
    close(report[0]);
    const int code = RunServerChild(control[0], report[1], tls);
    std::fflush(nullptr);
    _exit(code);
  }
  close(control[0]);
  close(report[1]);
  ServerChild child;
  child.pid = pid;
  child.control_fd = control[1];
  std::string line;
  char buffer[256];
  ssize_t n;
  while ((n = read(report[0], buffer, sizeof(buffer))) > 0 ||
         (n < 0 && errno == EINTR)) {
    if (n > 0) line.append(buffer, static_cast<size_t>(n));
  }
  close(report[0]);
  std::vector<std::string> fields =
      absl::StrSplit(line, absl::ByAnyChar(" \n"), absl::SkipEmpty());
  if (fields.size() != 3 || !absl::SimpleAtoi(fields[1], &child.raw_port)) {
    close(child.control_fd);
    waitpid(pid, nullptr, 0);
    return absl::InternalError("the transport server process did not start");
  }
  child.grpc_address = fields[0];
  child.tls_address = fields[2];
  return child;
}

// Tells the child to exit and reaps it; INTERNAL unless it exited 0.
absl::Status StopServerChild(const ServerChild& child) {
  close(child.control_fd);
  int status = 0;
  if (waitpid(child.pid, &status, 0) != child.pid) return ErrnoError("waitpid");
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InternalError(absl::StrCat(
        "the transport server process ended with status ", status));
  }
  return absl::OkStatus();
}

// What both sides of the comparison move: `chunks` chunks of chunk_elems
// (the last may be shorter) of `params` bf16 elements, each way.
struct Workload {
  uint64_t params = 0;
  uint64_t chunk_elems = 0;
  int inflight = 1;
  std::string grads;    // params bf16 values
  std::string weights;  // params bf16 values, written by each step
  uint64_t chunks() const { return (params + chunk_elems - 1) / chunk_elems; }
  uint64_t ChunkBytes(uint64_t c) const {
    return (std::min(params, (c + 1) * chunk_elems) - c * chunk_elems) *
           kElemBytes;
  }
};

// One raw socket's share of a step: chunks [first, end) written by a thread
// while at most `inflight` are unanswered, answers read into place.
absl::Status RawPart(int fd, Workload& work, uint64_t first, uint64_t end) {
  absl::Mutex mu;
  uint64_t sent = 0;
  uint64_t answered = 0;
  bool failed = false;
  const uint64_t window = static_cast<uint64_t>(work.inflight);
  std::thread writer([&] {
    for (uint64_t c = first; c < end; ++c) {
      {
        absl::MutexLock lock(&mu);
        auto may_send = [&] { return failed || sent - answered < window; };
        mu.Await(absl::Condition(&may_send));
        if (failed) return;
        ++sent;
      }
      const uint64_t offset = c * work.chunk_elems * kElemBytes;
      if (!WriteFrame(fd, work.grads.data() + offset, work.ChunkBytes(c))) {
        absl::MutexLock lock(&mu);
        failed = true;
        return;
      }
    }
  });
  absl::Status status;
  for (uint64_t c = first; c < end && status.ok(); ++c) {
    uint64_t size = 0;
    const uint64_t offset = c * work.chunk_elems * kElemBytes;
    if (!ReadAll(fd, &size, sizeof(size)) || size != work.ChunkBytes(c) ||
        !ReadAll(fd, work.weights.data() + offset, size)) {
      status = absl::InternalError("raw TCP: the echo broke off");
    }
    absl::MutexLock lock(&mu);
    ++answered;
    if (!status.ok()) failed = true;
  }
  writer.join();
  return status;
}

// One raw step: the chunks split over the sockets like Depot's connections.
absl::Status RawStep(const std::vector<int>& sockets, Workload& work) {
  const uint64_t parts = std::min<uint64_t>(sockets.size(), work.chunks());
  std::vector<absl::Status> results(parts);
  std::vector<std::thread> threads;
  for (uint64_t p = 0; p < parts; ++p) {
    threads.emplace_back([&, p] {
      results[p] = RawPart(sockets[p], work, work.chunks() * p / parts,
                           work.chunks() * (p + 1) / parts);
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (const absl::Status& status : results) {
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int>> ConnectRaw(int port, int count) {
  std::vector<int> sockets;
  for (int i = 0; i < count; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(static_cast<uint16_t>(port));
    if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&address),
                          sizeof(address)) != 0) {
      const absl::Status error = ErrnoError("raw TCP connect");
      if (fd >= 0) close(fd);
      for (int open : sockets) close(open);
      return error;
    }
    SetNoDelay(fd);
    sockets.push_back(fd);
  }
  return sockets;
}

// The part of the run that uses gRPC: Depot's client against the child,
// interleaved with the raw sockets. Returns the result line.
// A client of `address` (with TLS and the token when `tls` is set) and the
// benchmark's job on it.
struct BenchJob {
  std::unique_ptr<Client> client;
  std::unique_ptr<Job> job;
};

absl::StatusOr<BenchJob> OpenBenchJob(const std::string& address,
                                      const Workload& work,
                                      const TlsFiles* tls) {
  ClientOptions options;
  options.servers = {address};
  options.connections_per_server = absl::GetFlag(FLAGS_transport_connections);
  options.max_inflight_chunks = work.inflight;
  if (tls != nullptr) {
    options.tls_ca_file = tls->ca;
    options.auth_token = tls->token;
  }
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  if (!client.ok()) return client.status();
  if (absl::Status s = (*client)->WaitForServers(absl::Seconds(30)); !s.ok()) {
    return s;
  }
  JobConfig config;
  config.name = "transport";
  config.tensors = {{"w", work.params, 0}};
  config.num_workers = 1;
  config.grad_dtype = DType::kBFloat16;
  config.weight_dtype = DType::kBFloat16;
  config.chunk_elems = work.chunk_elems;
  config.alignment_elems = 1;  // no padding: the job is exactly `params`
  absl::StatusOr<std::unique_ptr<Job>> job = (*client)->OpenJob(config, 0);
  if (!job.ok()) return job.status();
  if ((*job)->total_elems() != work.params) {
    return absl::InternalError("the job's layout padded the parameters");
  }
  return BenchJob{*std::move(client), *std::move(job)};
}

absl::StatusOr<ResultLine> Measure(const ServerChild& child, Workload& work,
                                   const std::vector<int>& raw,
                                   const TlsFiles& tls) {
  absl::StatusOr<BenchJob> plain =
      OpenBenchJob(child.grpc_address, work, nullptr);
  if (!plain.ok()) return plain.status();
  absl::StatusOr<BenchJob> secured =
      OpenBenchJob(child.tls_address, work, &tls);
  if (!secured.ok()) return secured.status();

  // Wall and CPU seconds (both processes, every thread) of a round.
  struct Round {
    double seconds = 0;
    double cpu_seconds = 0;
  };
  auto timed = [&](int steps, const std::function<absl::Status()>& one_step)
      -> absl::StatusOr<Round> {
    const double cpu =
        ProcessCpuSeconds(getpid()) + ProcessCpuSeconds(child.pid);
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < steps; ++i) {
      if (absl::Status s = one_step(); !s.ok()) return s;
    }
    Round round;
    round.seconds = SecondsSince(start);
    round.cpu_seconds =
        ProcessCpuSeconds(getpid()) + ProcessCpuSeconds(child.pid) - cpu;
    return round;
  };
  uint64_t step = 0;
  auto depot_round = [&](int steps) {
    return timed(steps, [&] {
      return plain->job->Step(++step, work.grads.data(), work.weights.data(),
                              nullptr);
    });
  };
  uint64_t tls_step = 0;
  auto tls_round = [&](int steps) {
    return timed(steps, [&] {
      return secured->job->Step(++tls_step, work.grads.data(),
                                work.weights.data(), nullptr);
    });
  };
  auto raw_round = [&](int steps) {
    return timed(steps, [&] { return RawStep(raw, work); });
  };
  // Warm-up (connections, first touch of the buffers), and a check that both
  // really moved the bytes: the no-op server and the echo return the
  // gradients.
  for (const char* path : {"Depot", "Depot with TLS", "raw TCP"}) {
    std::fill(work.weights.begin(), work.weights.end(), '\0');
    const absl::string_view name = path;
    absl::StatusOr<Round> round = name == "Depot"     ? depot_round(1)
                                  : name == "raw TCP" ? raw_round(1)
                                                      : tls_round(1);
    if (!round.ok()) return round.status();
    if (work.weights != work.grads) {
      return absl::InternalError(absl::StrCat(
          path, " returned other weights than the gradients sent"));
    }
  }

  const int steps = absl::GetFlag(FLAGS_transport_steps);
  std::vector<double> depot_seconds, depot_cpu;
  std::vector<double> raw_seconds, raw_cpu;
  std::vector<double> tls_seconds, tls_cpu;
  for (int r = 0; r < absl::GetFlag(FLAGS_transport_repeats); ++r) {
    absl::StatusOr<Round> a = depot_round(steps);
    if (!a.ok()) return a.status();
    absl::StatusOr<Round> b = raw_round(steps);
    if (!b.ok()) return b.status();
    absl::StatusOr<Round> c = tls_round(steps);
    if (!c.ok()) return c.status();
    depot_seconds.push_back(a->seconds / steps);
    depot_cpu.push_back(a->cpu_seconds / steps);
    raw_seconds.push_back(b->seconds / steps);
    raw_cpu.push_back(b->cpu_seconds / steps);
    tls_seconds.push_back(c->seconds / steps);
    tls_cpu.push_back(c->cpu_seconds / steps);
  }
  const double bytes = 2.0 * static_cast<double>(work.params) * kElemBytes;
  const double depot_gbps = bytes / Median(depot_seconds) / 1e9;
  const double raw_gbps = bytes / Median(raw_seconds) / 1e9;
  const double tls_gbps = bytes / Median(tls_seconds) / 1e9;
  ResultLine line;
  line.bench = "transport";
  line.text = {{"link", "loopback"}, {"dtype", "bf16"}};
  line.numbers = {
      {"params", static_cast<double>(work.params)},
      {"chunk_elems", static_cast<double>(work.chunk_elems)},
      {"connections",
       static_cast<double>(absl::GetFlag(FLAGS_transport_connections))},
      {"raw_connections", static_cast<double>(raw.size())},
      {"inflight", static_cast<double>(work.inflight)},
      {"repeats", static_cast<double>(depot_seconds.size())},
      {"steps_per_round", static_cast<double>(steps)},
      {"bytes_per_step", bytes},
      {"depot_step_seconds", Median(depot_seconds)},
      {"raw_step_seconds", Median(raw_seconds)},
      // CPU seconds per step of both processes together: on a small machine
      // the transfer is CPU bound, and this shows what the wall time hides.
      {"depot_cpu_seconds", Median(depot_cpu)},
      {"raw_cpu_seconds", Median(raw_cpu)},
      {"depot_gb_per_s", depot_gbps},
      {"raw_gb_per_s", raw_gbps},
      {"ratio", depot_gbps / raw_gbps},
      // The same job on a server with TLS and a bearer token, in the same
      // rounds: what encryption costs (docs/security.md).
      {"tls_step_seconds", Median(tls_seconds)},
      {"tls_cpu_seconds", Median(tls_cpu)},
      {"tls_gb_per_s", tls_gbps},
      {"tls_ratio", tls_gbps / raw_gbps},
      {"tls_vs_plaintext", tls_gbps / depot_gbps},
  };
  return line;
}

}  // namespace

absl::Status RunTransportCommand(bool json) {
  Workload work;
  work.params = absl::GetFlag(FLAGS_transport_params);
  work.chunk_elems = absl::GetFlag(FLAGS_transport_chunk_elems);
  work.inflight = absl::GetFlag(FLAGS_transport_inflight);
  const int raw_connections = absl::GetFlag(FLAGS_transport_raw_connections);
  if (work.params == 0 || work.chunk_elems == 0 || work.inflight < 1 ||
      raw_connections < 1 || absl::GetFlag(FLAGS_transport_repeats) < 1 ||
      absl::GetFlag(FLAGS_transport_steps) < 1) {
    return absl::InvalidArgumentError(
        "transport: --transport_params, --transport_chunk_elems, "
        "--transport_inflight, --transport_raw_connections, "
        "--transport_repeats and --transport_steps must be positive");
  }
  absl::StatusOr<TlsFiles> tls = MakeTlsFiles();
  if (!tls.ok()) return tls.status();
  // The server first, before this process touches gRPC (a forked child
  // must not inherit gRPC's threads).
  absl::StatusOr<ServerChild> child = StartServerChild(*tls);
  if (!child.ok()) {
    std::filesystem::remove_all(tls->dir);
    return child.status();
  }
  work.grads.resize(work.params * kElemBytes);
  work.weights.resize(work.params * kElemBytes);
  for (size_t i = 0; i < work.grads.size(); ++i) {
    work.grads[i] = static_cast<char>(i * 131 + (i >> 12));
  }
  absl::StatusOr<ResultLine> line = absl::InternalError("not run");
  absl::StatusOr<std::vector<int>> raw =
      ConnectRaw(child->raw_port, raw_connections);
  if (raw.ok()) {
    line = Measure(*child, work, *raw, *tls);
    for (int fd : *raw) close(fd);
  } else {
    line = raw.status();
  }
  const absl::Status stopped = StopServerChild(*child);
  std::filesystem::remove_all(tls->dir);
  if (!line.ok()) return line.status();
  if (!stopped.ok()) return stopped;
  line->Print(json);
  return absl::OkStatus();
}

}  // namespace depot::bench
