#include "tests/bench/checkpoint_bench.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "depot/client.h"
#include "metrics_scrape.h"
#include "server/durable_file.h"
#include "server_process.h"
#include "tests/bench/bench_output.h"

ABSL_FLAG(uint64_t, checkpoint_params, uint64_t{32} << 20,
          "checkpoint: parameters of the job (bf16 gradients and weights, "
          "fp32 master weights and AdamW moments on the server).");
ABSL_FLAG(int32_t, checkpoint_steps, 40, "checkpoint: timed steps.");
ABSL_FLAG(int32_t, checkpoint_every, 4,
          "checkpoint: the server's --checkpoint_every_steps.");
ABSL_FLAG(std::string, checkpoint_dir, "",
          "checkpoint: where the server writes (the disk measured); empty: "
          "a new directory under $TMPDIR (or /tmp), removed afterwards.");
ABSL_FLAG(int64_t, checkpoint_max_lag_steps, -1,
          "checkpoint: the server's --checkpoint_max_lag_steps (0: a step "
          "after a checkpoint step waits for the write; -1: none waits).");
ABSL_FLAG(int32_t, checkpoint_threads, 0,
          "checkpoint: the server's update threads (0: one per hardware "
          "thread).");

namespace depot::bench {
namespace {

namespace fs = std::filesystem;

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

absl::StatusOr<double> Metric(const testing::ServerProcess& server,
                              const std::string& series) {
  absl::StatusOr<std::string> text =
      testing::ScrapeMetrics(server.metrics_address());
  if (!text.ok()) return text.status();
  return testing::MetricValue(*text, series);
}

// Writes `bytes` bytes to a new file in `dir` as the checkpoint writer does
// (WriteFileDurably bypassing the page cache: O_DIRECT where the filesystem
// takes it, then fsync, rename, the directory's fsync), and removes it: the
// seconds it took.
absl::StatusOr<double> DiskProbe(const std::string& dir, uint64_t bytes) {
  const std::string path = absl::StrCat(dir, "/depot-bench-disk-probe");
  const std::string block(4 << 20, '\x5a');
  const auto start = std::chrono::steady_clock::now();
  absl::Status written = WriteFileDurably(
      path,
      [&](const std::function<absl::Status(std::string_view)>& sink) {
        for (uint64_t left = bytes; left > 0;) {
          const size_t n =
              static_cast<size_t>(std::min<uint64_t>(left, block.size()));
          if (absl::Status s = sink(std::string_view(block).substr(0, n));
              !s.ok()) {
            return s;
          }
          left -= n;
        }
        return absl::OkStatus();
      },
      SystemFileSync(), FileCache::kBypass);
  const double seconds = SecondsSince(start);
  unlink(path.c_str());
  if (!written.ok()) return written;
  return seconds;
}

}  // namespace

absl::Status RunCheckpointCommand(bool json) {
  const uint64_t params = absl::GetFlag(FLAGS_checkpoint_params);
  const int steps = absl::GetFlag(FLAGS_checkpoint_steps);
  const int every = absl::GetFlag(FLAGS_checkpoint_every);
  const int threads = absl::GetFlag(FLAGS_checkpoint_threads);
  if (params == 0 || steps < 2 * every || every < 1) {
    return absl::InvalidArgumentError(
        "checkpoint: --checkpoint_params > 0, --checkpoint_every >= 1 and "
        "--checkpoint_steps >= 2 x --checkpoint_every");
  }
  std::string dir = absl::GetFlag(FLAGS_checkpoint_dir);
  bool remove_dir = false;
  if (dir.empty()) {
    const char* base = getenv("TMPDIR");
    std::string pattern = absl::StrCat(base != nullptr ? base : "/tmp",
                                       "/depot-bench-checkpoint-XXXXXX");
    if (mkdtemp(pattern.data()) == nullptr) {
      return absl::InternalError("checkpoint: mkdtemp failed");
    }
    dir = pattern;
    remove_dir = true;
  }
  std::vector<std::string> flags = {
      absl::StrCat("--checkpoint_dir=", dir),
      absl::StrCat("--checkpoint_every_steps=", every),
      "--checkpoint_keep=1",
      absl::StrCat("--checkpoint_max_lag_steps=",
                   absl::GetFlag(FLAGS_checkpoint_max_lag_steps))};
  if (threads > 0) flags.push_back(absl::StrCat("--threads=", threads));
  absl::StatusOr<std::unique_ptr<testing::ServerProcess>> server =
      testing::ServerProcess::Start(flags);
  if (!server.ok()) return server.status();

  ClientOptions options;
  options.servers = {(*server)->grpc_address()};
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  if (!client.ok()) return client.status();
  if (absl::Status s = (*client)->WaitForServers(absl::Seconds(30)); !s.ok()) {
    return s;
  }
  JobConfig config;
  config.name = "checkpoint-bench";
  config.tensors = {{"w", params, 0}};
  config.optimizer.kind = OptimizerKind::kAdamW;
  config.grad_dtype = DType::kBFloat16;
  config.weight_dtype = DType::kBFloat16;
  absl::StatusOr<std::unique_ptr<Job>> job = (*client)->OpenJob(config, 0);
  if (!job.ok()) return job.status();
  std::vector<float> init((*job)->total_elems(), 0.01f);
  if (absl::Status s = (*job)->InitWeights(init.data(), DType::kFloat32);
      !s.ok()) {
    return s;
  }
  // bf16 gradients of a small constant value; weights out.
  std::vector<uint16_t> grads((*job)->total_elems(), 0x3a83);
  std::vector<uint16_t> weights((*job)->total_elems());

  std::vector<double> normal, capture, writing;
  const std::string written_series = "depot_checkpoints_written_total";
  for (int step = 1; step <= steps; ++step) {
    // A write is in progress when fewer checkpoints have been counted than
    // capture steps have passed.
    absl::StatusOr<double> before = Metric(**server, written_series);
    if (!before.ok()) return before.status();
    const uint64_t captures_before = static_cast<uint64_t>((step - 1) / every);
    const bool write_pending = *before < static_cast<double>(captures_before);
    const auto start = std::chrono::steady_clock::now();
    if (absl::Status s = (*job)->Step(step, grads.data(), weights.data(),
                                      nullptr, StepOptions());
        !s.ok()) {
      return s;
    }
    const double seconds = SecondsSince(start);
    // Warm-up: the steps before the first capture.
    if (step <= every) continue;
    if (step % every == 0) {
      capture.push_back(seconds);
    } else if (write_pending) {
      writing.push_back(seconds);
    } else {
      normal.push_back(seconds);
    }
  }
  // Let the last write finish (every capture step is written or skipped),
  // then read what the writes cost.
  const auto drain_start = std::chrono::steady_clock::now();
  while (true) {
    absl::StatusOr<double> done = Metric(**server, written_series);
    absl::StatusOr<double> passed =
        Metric(**server, "depot_checkpoints_skipped_total");
    if (!done.ok()) return done.status();
    if (!passed.ok()) return passed.status();
    if (*done + *passed >= static_cast<double>(steps / every)) break;
    if (SecondsSince(drain_start) > 300) {
      return absl::DeadlineExceededError(
          "checkpoint: the last checkpoint was not written within 300 s");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  absl::StatusOr<double> ckpt_bytes =
      Metric(**server, "depot_checkpoint_written_bytes_total");
  absl::StatusOr<double> ckpt_seconds =
      Metric(**server, "depot_checkpoint_write_seconds_sum");
  absl::StatusOr<double> ckpt_count = Metric(**server, written_series);
  absl::StatusOr<double> skipped =
      Metric(**server, "depot_checkpoints_skipped_total");
  if (!ckpt_bytes.ok()) return ckpt_bytes.status();
  if (!ckpt_seconds.ok()) return ckpt_seconds.status();
  if (!ckpt_count.ok()) return ckpt_count.status();
  const double written = *ckpt_count;
  const double bytes_each = *ckpt_bytes / std::max(written, 1.0);
  absl::StatusOr<double> disk = DiskProbe(dir, static_cast<uint64_t>(bytes_each));
  if (!disk.ok()) return disk.status();
  server->reset();
  if (remove_dir) fs::remove_all(dir);
  if (normal.empty()) {
    return absl::FailedPreconditionError(
        "checkpoint: every step overlapped a capture or a write: raise "
        "--checkpoint_every");
  }

  std::vector<double> affected = capture;
  affected.insert(affected.end(), writing.begin(), writing.end());
  const double normal_s = Median(normal);
  const double affected_s = affected.empty() ? normal_s : Median(affected);
  // The mean too: with --checkpoint_max_lag_steps=0 one step per checkpoint
  // waits for the write, which a median does not show.
  double affected_mean_s = normal_s;
  if (!affected.empty()) {
    affected_mean_s = 0;
    for (const double s : affected) affected_mean_s += s;
    affected_mean_s /= static_cast<double>(affected.size());
  }
  const int64_t max_lag = absl::GetFlag(FLAGS_checkpoint_max_lag_steps);
  const double ckpt_gb_per_s = *ckpt_bytes / *ckpt_seconds / 1e9;
  const double disk_gb_per_s = bytes_each / *disk / 1e9;
  if (json) {
    std::printf(
        "{\"bench\": \"checkpoint\", \"params\": %llu, \"steps\": %d, "
        "\"every\": %d, \"checkpoints\": %.0f, \"skipped\": %.0f, "
        "\"checkpoint_bytes\": %.0f, \"normal_steps\": %zu, "
        "\"capture_steps\": %zu, \"writing_steps\": %zu, \"normal_s\": %.6f, "
        "\"capture_s\": %.6f, \"writing_s\": %.6f, \"affected_s\": %.6f, "
        "\"ratio\": %.4f, \"max_lag_steps\": %lld, \"affected_mean_s\": %.6f, "
        "\"mean_ratio\": %.4f, \"checkpoint_write_s\": %.6f, "
        "\"checkpoint_gb_per_s\": %.4f, \"disk_s\": %.6f, "
        "\"disk_gb_per_s\": %.4f, \"write_ratio\": %.4f}\n",
        static_cast<unsigned long long>(params), steps, every, written,
        skipped.ok() ? *skipped : -1.0, bytes_each, normal.size(),
        capture.size(), writing.size(), normal_s,
        capture.empty() ? 0.0 : Median(capture),
        writing.empty() ? 0.0 : Median(writing), affected_s,
        affected_s / normal_s, static_cast<long long>(max_lag),
        affected_mean_s, affected_mean_s / normal_s,
        *ckpt_seconds / std::max(written, 1.0),
        ckpt_gb_per_s, *disk, disk_gb_per_s, ckpt_gb_per_s / disk_gb_per_s);
  } else {
    std::printf(
        "checkpoint: %llu params, a checkpoint every %d steps (%.0f written, "
        "%.0f skipped, %.1f MiB each)\n"
        "  step: normal %.4f s (%zu steps), capture %.4f s (%zu), while "
        "writing %.4f s (%zu): ratio %.3f (goal <= 1.2), of the means %.3f "
        "(--checkpoint_max_lag_steps=%lld)\n"
        "  write: %.3f GB/s (%.3f s each) vs the disk's %.3f GB/s "
        "(write+fsync of as many bytes, same directory): %.3f\n",
        static_cast<unsigned long long>(params), every, written,
        skipped.ok() ? *skipped : -1.0, bytes_each / 1048576.0, normal_s,
        normal.size(), capture.empty() ? 0.0 : Median(capture), capture.size(),
        writing.empty() ? 0.0 : Median(writing), writing.size(),
        affected_s / normal_s, affected_mean_s / normal_s,
        static_cast<long long>(max_lag), ckpt_gb_per_s,
        *ckpt_seconds / std::max(written, 1.0), disk_gb_per_s,
        ckpt_gb_per_s / disk_gb_per_s);
  }
  return absl::OkStatus();
}

}  // namespace depot::bench
