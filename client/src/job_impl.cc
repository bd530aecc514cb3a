#include "job_impl.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "call_group.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/sync_stream.h"
#include "step_commit.h"
#include "step_stream.h"
#include "wire/wire.h"

namespace depot::client_internal {

JobImpl::JobImpl(JobConfig config, Layout layout, ShardPlan plan,
                 uint64_t fingerprint, uint32_t worker_rank,
                 std::shared_ptr<const Connections> connections,
                 ClientOptions options, std::vector<uint64_t> job_ids)
    : Job(std::move(config), std::move(layout), std::move(plan), fingerprint,
          worker_rank),
      connections_(std::move(connections)),
      options_(std::move(options)),
      job_ids_(std::move(job_ids)) {}

std::vector<uint32_t> JobImpl::ServersWithChunks() const {
  std::vector<uint32_t> servers;
  for (uint32_t s = 0; s < plan().num_servers(); ++s) {
    if (plan().shard(s).num_chunks() > 0) servers.push_back(s);
  }
  return servers;
}

absl::Status JobImpl::InitWeights(const void* weights, DType dtype) {
  if (weights == nullptr) {
    return absl::InvalidArgumentError("InitWeights: weights is null");
  }
  const absl::Time deadline = absl::Now() + options_.step_timeout;
  return RunOnServers(*connections_, ServersWithChunks(),
                      [&](uint32_t server, CallGroup& group) {
                        return InitShard(server, weights, dtype, deadline,
                                         group);
                      });
}

absl::Status JobImpl::InitShard(uint32_t server, const void* weights,
                                DType dtype, absl::Time deadline,
                                CallGroup& group) const {
  GroupContext context(group, deadline);
  v1::InitWeightsResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::InitWeightsRequest>> writer =
      (*connections_)[server]->depot->InitWeights(context.get(), &response);

  v1::InitWeightsRequest request;
  v1::InitHeader* header = request.mutable_header();
  header->set_job_id(job_ids_[server]);
  header->set_fingerprint(fingerprint());
  header->set_dtype(DTypeToProto(dtype));
  bool writing = writer->Write(request);

  const ShardRange& shard = plan().shard(server);
  const size_t size = DTypeSize(dtype);
  const char* bytes = static_cast<const char*>(weights);
  for (uint64_t index = shard.first_chunk; writing && index < shard.end_chunk;
       ++index) {
    const ChunkRange chunk = plan().chunk(index);
    v1::Chunk* message = request.mutable_chunk();  // reuses its buffer
    message->set_index(index);
    message->mutable_payload()->assign(bytes + chunk.begin * size,
                                       chunk.size() * size);
    writing = writer->Write(request);
  }
  if (writing) writer->WritesDone();
  const grpc::Status status = writer->Finish();
  if (!status.ok()) return FromGrpcStatus(status);
  if (response.chunks() != shard.num_chunks()) {
    return absl::InternalError(
        absl::StrCat("InitWeights: server accepted ", response.chunks(),
                     " chunks of the shard's ", shard.num_chunks()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> JobImpl::TensorBitmap(
    const std::vector<uint32_t>& tensors, absl::string_view field) const {
  if (tensors.empty()) return std::string();
  const size_t count = layout().tensors().size();
  std::string bitmap((count + 7) / 8, '\0');
  for (const uint32_t t : tensors) {
    if (t >= count) {
      return absl::InvalidArgumentError(
          absl::StrCat("Step: ", field, " names tensor ", t, ", the job has ",
                       count, " tensors"));
    }
    const char bit = static_cast<char>(1u << (t % 8));
    if (bitmap[t / 8] & bit) {
      return absl::InvalidArgumentError(
          absl::StrCat("Step: ", field, " lists tensor ", t, " twice"));
    }
    bitmap[t / 8] = static_cast<char>(bitmap[t / 8] | bit);
  }
  return bitmap;
}

absl::StatusOr<std::vector<ChunkOverride>> JobImpl::OverridePieces(
    const std::vector<TensorWeights>& tensors) const {
  std::vector<ChunkOverride> pieces;
  std::vector<bool> seen(layout().tensors().size(), false);
  for (const TensorWeights& tensor : tensors) {
    if (tensor.tensor_index >= seen.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("Step: weight_overrides names tensor ",
                       tensor.tensor_index, ", the job has ", seen.size(),
                       " tensors"));
    }
    if (seen[tensor.tensor_index]) {
      return absl::InvalidArgumentError(
          absl::StrCat("Step: weight_overrides lists tensor ",
                       tensor.tensor_index, " twice"));
    }
    seen[tensor.tensor_index] = true;
    if (tensor.values == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("Step: weight_overrides of tensor ",
                       tensor.tensor_index, " has null values"));
    }
    // The tensor's elements, cut at chunk boundaries.
    const uint64_t begin = layout().offset(tensor.tensor_index);
    const uint64_t end =
        begin + layout().tensors()[tensor.tensor_index].numel;
    for (uint64_t pos = begin; pos < end;) {
      const uint64_t index = pos / plan().chunk_elems();
      const ChunkRange chunk = plan().chunk(index);
      const uint64_t piece_end = std::min(end, chunk.end);
      pieces.push_back({index, pos - chunk.begin, tensor.values + (pos - begin),
                        piece_end - pos});
      pos = piece_end;
    }
  }
  std::stable_sort(pieces.begin(), pieces.end(),
                   [](const ChunkOverride& a, const ChunkOverride& b) {
                     return a.chunk_index < b.chunk_index;
                   });
  return pieces;
}

bool JobImpl::NeedsTwoPhases(const StepOptions& options) const {
  if (options.known_commit.has_value()) return false;
  const OptimizerConfig& optimizer = config().optimizer;
  const bool dynamic_loss_scale =
      optimizer.loss_scale == 0.0 && config().grad_dtype == DType::kFloat16;
  return optimizer.clip_grad > 0.0 ||
         optimizer.grad_norm_skip_threshold > 0.0 || dynamic_loss_scale;
}

absl::Status JobImpl::StepOnce(uint64_t step, const void* grads,
                               void* weights_out, StepResult* result,
                               const StepOptions& options) {
  if (grads == nullptr || weights_out == nullptr) {
    return absl::InvalidArgumentError("Step: grads or weights_out is null");
  }
  absl::StatusOr<std::string> no_grad = CheckStepOptions(step, options);
  if (!no_grad.ok()) return no_grad.status();
  absl::StatusOr<std::vector<ChunkOverride>> overrides =
      OverridePieces(options.weight_overrides);
  if (!overrides.ok()) return overrides.status();
  const absl::Time start = absl::Now();
  const std::vector<uint32_t> servers = ServersWithChunks();
  std::optional<CommitBarrier> barrier;
  if (NeedsTwoPhases(options)) barrier.emplace(config().optimizer, servers);
  StepStreamParams params = StreamParams(step, options, *no_grad, start);
  params.overrides = &*overrides;
  params.barrier = barrier.has_value() ? &*barrier : nullptr;
  params.grads = grads;
  params.weights_out = weights_out;

  std::vector<StepStreamStats> stats(plan().num_servers());
  absl::Status status = RunOnServers(
      *connections_, servers, [&](uint32_t server, CallGroup& group) {
        StepStreamParams server_params = params;
        server_params.job_id = job_ids_[server];
        server_params.server = server;
        absl::StatusOr<StepStreamStats> server_stats =
            StepServer(server_params, group);
        if (!server_stats.ok()) {
          // Streams waiting for this server's GradStats must not wait on.
          if (barrier.has_value()) barrier->Abort(server_stats.status());
          return server_stats.status();
        }
        stats[server] = *server_stats;
        return absl::OkStatus();
      });
  if (!status.ok()) {
    return ExplainStepDeadline(step, params.deadline, servers,
                               std::move(status));
  }
  if (result != nullptr) {
    FillResult(step, options, stats,
               barrier.has_value() ? &*barrier : nullptr, start, result);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> JobImpl::CheckStepOptions(
    uint64_t step, const StepOptions& options) const {
  if (step == 0) {
    return absl::InvalidArgumentError("Step: steps are numbered from 1");
  }
  if (!std::isfinite(options.loss_scale) || options.loss_scale <= 0.0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Step: loss_scale must be finite and > 0 (1 = none), got ",
                     options.loss_scale));
  }
  if (options.known_commit.has_value() && !options.known_commit->skip &&
      !(options.known_commit->clip_coef > 0.0 &&
        options.known_commit->clip_coef <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Step: known_commit.clip_coef must be in (0, 1] unless skip, got ",
        options.known_commit->clip_coef));
  }
  return TensorBitmap(options.no_grad_tensors);
}

StepStreamParams JobImpl::StreamParams(uint64_t step,
                                       const StepOptions& options,
                                       const std::string& no_grad,
                                       absl::Time start) const {
  StepStreamParams params;
  params.fingerprint = fingerprint();
  params.step = step;
  params.worker_rank = worker_rank();
  params.group_hparams = &options.group_hparams;
  params.loss_scale = options.loss_scale;
  params.known_commit = options.known_commit;
  params.no_grad_tensors = &no_grad;
  params.plan = &plan();
  params.grad_dtype = config().grad_dtype;
  params.weight_dtype = config().weight_dtype;
  params.max_inflight_chunks = options_.max_inflight_chunks;
  params.deadline = start + options_.step_timeout;
  params.unavailable_retry = options_.unavailable_retry;
  return params;
}

void JobImpl::FillResult(uint64_t step, const StepOptions& options,
                         const std::vector<StepStreamStats>& stats,
                         const CommitBarrier* barrier, absl::Time start,
                         StepResult* result) const {
  *result = StepResult();
  result->step = step;
  for (const StepStreamStats& s : stats) {
    result->chunks += s.chunks;
    result->chunks_replayed += s.chunks_replayed;
    result->bytes_sent += s.bytes_sent;
    result->bytes_received += s.bytes_received;
    result->update_seconds += s.update_seconds;
  }
  StepCommit applied = options.known_commit.value_or(StepCommit());
  if (barrier != nullptr) {
    // Every stream succeeded, so every server reported.
    const GradDecision decision = *barrier->decision();
    result->two_phase = true;
    result->grad_norm = decision.grad_norm;
    result->zero_count = decision.zero_count;
    result->found_inf = decision.found_inf;
    applied = decision.commit;
  }
  result->skipped = applied.skip;
  result->clip_coef = applied.skip ? 1.0 : applied.clip_coef;
  result->wall_seconds = absl::ToDoubleSeconds(absl::Now() - start);
}

absl::Status JobImpl::StepStreamed(const StreamedStep& step,
                                   StepResult* result) {
  if (step.options == nullptr || step.sink == nullptr) {
    return absl::InvalidArgumentError("StepStreamed: options or sink is null");
  }
  const StepOptions& options = *step.options;
  absl::StatusOr<std::string> no_grad = CheckStepOptions(step.step, options);
  if (!no_grad.ok()) return no_grad.status();
  if (!options.weight_overrides.empty()) {
    return absl::InvalidArgumentError(
        "StepStreamed: weight_overrides are not supported on a streamed step");
  }
  const bool two_phase = NeedsTwoPhases(options);
  std::vector<uint32_t> servers;
  for (const StreamedStep::Route& route : step.routes) {
    const ShardRange* shard =
        route.server < plan().num_servers() ? &plan().shard(route.server)
                                            : nullptr;
    if (shard == nullptr || route.feed == nullptr ||
        (route.chunks == 0 && !two_phase) ||
        route.first_chunk < shard->first_chunk ||
        route.end_chunk > shard->end_chunk ||
        route.chunks > route.end_chunk - route.first_chunk) {
      return absl::InvalidArgumentError(absl::StrCat(
          "StepStreamed: a route to server ", route.server,
          " is not inside its shard, has no feed, or has no chunks in a "
          "one-phase step"));
    }
    servers.push_back(route.server);
  }
  // The servers of the routes, each once, in server order (routes to one
  // server need not be next to each other).
  std::sort(servers.begin(), servers.end());
  servers.erase(std::unique(servers.begin(), servers.end()), servers.end());
  std::optional<CommitBarrier> barrier;
  if (two_phase) {
    // Every server's GradStats decide the step: one stream to each server
    // with chunks, whether or not this process sends any of them.
    if (servers != ServersWithChunks() ||
        servers.size() != step.routes.size()) {
      return absl::InvalidArgumentError(
          "StepStreamed: a two-phase step needs exactly one route to every "
          "server that holds chunks");
    }
    barrier.emplace(config().optimizer, servers);
  }
  const absl::Time start = absl::Now();
  StepStreamParams params = StreamParams(step.step, options, *no_grad, start);
  params.sink = step.sink;
  std::string sum_only;
  if (!step.sum_only_tensors.empty()) {
    absl::StatusOr<std::string> bitmap =
        TensorBitmap(step.sum_only_tensors, "sum_only_tensors");
    if (!bitmap.ok()) return bitmap.status();
    sum_only = *std::move(bitmap);
    params.sum_only_tensors = &sum_only;
    params.omit_sums = step.omit_sums;
    params.fills_captures = step.fills_captures;
  }
  params.barrier = barrier.has_value() ? &*barrier : nullptr;
  params.local_ranks = step.local_ranks;
  params.local_rank = step.local_rank;
  params.bucket_chunks = step.bucket_chunks;
  std::vector<StepStreamStats> stats(step.routes.size());
  std::vector<absl::Status> statuses(step.routes.size());
  CallGroup group;
  absl::Mutex failure_mu;
  bool failure_reported = false;
  auto run = [&](size_t r) {
    const StreamedStep::Route& route = step.routes[r];
    const ServerConnection& connection = *(*connections_)[route.server];
    StepStreamParams route_params = params;
    route_params.job_id = job_ids_[route.server];
    route_params.server = route.server;
    route_params.first_chunk = route.first_chunk;
    route_params.end_chunk = route.end_chunk;
    route_params.feed = route.feed;
    route_params.feed_chunks = route.chunks;
    // Routes to one server take its connections in turn.
    size_t nth = 0;
    for (size_t i = 0; i < r; ++i) nth += step.routes[i].server == route.server;
    absl::StatusOr<StepStreamStats> result = RunStepStream(
        *connection.step_channels[nth % connection.step_channels.size()],
        route_params, group);
    if (!result.ok()) {
      statuses[r] = WithServer(result.status(), connection.address);
      // Streams waiting for this server's GradStats must not wait on, nor
      // those waiting for chunks or weight slots.
      if (barrier.has_value()) barrier->Abort(statuses[r]);
      group.Fail(statuses[r]);
      if (step.on_failure) {
        absl::MutexLock lock(&failure_mu);
        if (!failure_reported) step.on_failure(group.status());
        failure_reported = true;
      }
      return;
    }
    stats[r] = *result;
  };
  std::vector<std::thread> threads;
  for (size_t r = 1; r < step.routes.size(); ++r) threads.emplace_back(run, r);
  if (!step.routes.empty()) run(0);
  for (std::thread& thread : threads) thread.join();
  if (absl::Status status = group.status(); !status.ok()) {
    return ExplainStepDeadline(step.step, params.deadline, servers,
                               std::move(status));
  }
  if (result != nullptr) {
    FillResult(step.step, options, stats,
               barrier.has_value() ? &*barrier : nullptr, start, result);
  }
  return absl::OkStatus();
}

bool StreamedStepIsTwoPhase(Job& job, const StepOptions& options) {
  JobImpl* impl = dynamic_cast<JobImpl*>(&job);
  return impl != nullptr && impl->NeedsTwoPhases(options);
}

absl::Status RunStreamedStep(Job& job, const StreamedStep& step,
                             StepResult* result) {
  JobImpl* impl = dynamic_cast<JobImpl*>(&job);
  if (impl == nullptr) {
    return absl::FailedPreconditionError(
        "a streamed step needs a Job that Client::OpenJob opened");
  }
  return impl->StepStreamed(step, result);
}

absl::StatusOr<std::unique_ptr<Job>> CopyJobHandle(const Job& job) {
  const JobImpl* impl = dynamic_cast<const JobImpl*>(&job);
  if (impl == nullptr) {
    return absl::FailedPreconditionError(
        "a second handle needs a Job that Client::OpenJob opened");
  }
  return std::make_unique<JobImpl>(*impl);
}

namespace {

// Whether attempt `attempt` (0: the first) of a Step stream failed in a way
// that sending it again may cure.
bool StepRetryable(const absl::Status& status, int attempt) {
  if (status.code() == absl::StatusCode::kUnavailable) return true;
  // After a failed attempt, the server may not have noticed yet that the
  // earlier stream is gone (a blackholed connection stays open on its side
  // until its keepalive gives up): it refuses the retry's chunks as
  // duplicates until then.
  return attempt > 0 && status.code() == absl::StatusCode::kAlreadyExists &&
         absl::StrContains(status.message(), "duplicate contribution");
}

absl::StatusOr<StepStreamStats> RunStepStreamRetrying(
    const StepChannel& channel, const StepStreamParams& params,
    CallGroup& group) {
  // A one-phase step from host memory can be sent again as it was: the
  // servers apply nothing twice (docs/protocol.md, "Idempotency and
  // retries"). Two-phase steps (a barrier shared with the other streams)
  // and streamed steps (a feed read once) are not retried.
  const bool may_retry = params.barrier == nullptr && params.feed == nullptr &&
                         params.unavailable_retry > absl::ZeroDuration();
  absl::Duration backoff = absl::Milliseconds(50);
  absl::Time give_up = absl::InfiniteFuture();
  for (int attempt = 0;; ++attempt) {
    absl::StatusOr<StepStreamStats> result =
        RunStepStream(channel, params, group);
    if (result.ok() || !may_retry ||
        !StepRetryable(result.status(), attempt) || !group.status().ok()) {
      return result;
    }
    const absl::Time now = absl::Now();
    if (attempt == 0) give_up = now + params.unavailable_retry;
    if (now + backoff >= give_up && give_up < params.deadline) {
      return absl::Status(
          result.status().code(),
          absl::StrCat(result.status().message(), " (sent ", attempt + 1,
                       " time(s) over ",
                       absl::FormatDuration(now - (give_up -
                                                   params.unavailable_retry)),
                       "; ClientOptions.unavailable_retry is ",
                       absl::FormatDuration(params.unavailable_retry), ")"));
    }
    if (now + backoff >= params.deadline) {
      // Out of time: the step's deadline is what ended it.
      return absl::DeadlineExceededError(absl::StrCat(
          "the step's deadline passed while its stream was being retried (",
          attempt + 1, " attempt(s)); the last: ",
          result.status().ToString()));
    }
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(2));
  }
}

}  // namespace

absl::StatusOr<StepStreamStats> JobImpl::StepServer(StepStreamParams params,
                                                    CallGroup& group) const {
  const ServerConnection& connection = *(*connections_)[params.server];
  const ShardRange& shard = plan().shard(params.server);
  // Contiguous parts of the shard, sizes within one chunk of each other, one
  // per connection (no empty part); a two-phase step keeps one stream.
  const uint64_t streams =
      params.barrier != nullptr ? 1 : connection.step_channels.size();
  const uint64_t parts = std::min<uint64_t>(streams, shard.num_chunks());
  std::vector<StepStreamParams> part_params(parts, params);
  for (uint64_t p = 0; p < parts; ++p) {
    part_params[p].first_chunk =
        shard.first_chunk + shard.num_chunks() * p / parts;
    part_params[p].end_chunk =
        shard.first_chunk + shard.num_chunks() * (p + 1) / parts;
  }
  std::vector<absl::StatusOr<StepStreamStats>> results(parts);
  auto run = [&](uint64_t p) {
    results[p] = RunStepStreamRetrying(*connection.step_channels[p],
                                       part_params[p], group);
    // The other parts of this server's shard must not run on.
    if (!results[p].ok()) {
      group.Fail(WithServer(results[p].status(), connection.address));
    }
  };
  std::vector<std::thread> threads;
  for (uint64_t p = 1; p < parts; ++p) threads.emplace_back(run, p);
  run(0);
  for (std::thread& thread : threads) thread.join();
  StepStreamStats total;
  for (const absl::StatusOr<StepStreamStats>& result : results) {
    if (!result.ok()) return result.status();
    total.chunks += result->chunks;
    total.chunks_replayed += result->chunks_replayed;
    total.bytes_sent += result->bytes_sent;
    total.bytes_received += result->bytes_received;
    total.update_seconds += result->update_seconds;
  }
  return total;
}

absl::Status JobImpl::Pull(uint64_t begin, uint64_t end, DType dtype, void* out,
                           uint64_t step) {
  if (begin > end || end > total_elems()) {
    return absl::OutOfRangeError(absl::StrCat("Pull: range [", begin, ", ", end,
                                              ") is not inside the job's [0, ",
                                              total_elems(), ")"));
  }
  if (begin == end) return absl::OkStatus();
  if (out == nullptr) return absl::InvalidArgumentError("Pull: out is null");
  // Each server returns the part of the range that lies in its shard.
  std::vector<uint32_t> servers;
  for (uint32_t s = 0; s < plan().num_servers(); ++s) {
    const ShardRange& shard = plan().shard(s);
    if (std::max(begin, shard.begin) < std::min(end, shard.end)) {
      servers.push_back(s);
    }
  }
  const absl::Time deadline = absl::Now() + options_.step_timeout;
  char* bytes = static_cast<char*>(out);
  const size_t size = DTypeSize(dtype);
  return RunOnServers(
      *connections_, servers, [&](uint32_t server, CallGroup& group) {
        const ShardRange& shard = plan().shard(server);
        const uint64_t from = std::max(begin, shard.begin);
        return PullRange(server, from, std::min(end, shard.end), dtype, step,
                         bytes + (from - begin) * size, deadline, group);
      });
}

absl::Status JobImpl::PullRange(uint32_t server, uint64_t begin, uint64_t end,
                                DType dtype, uint64_t step, void* out,
                                absl::Time deadline, CallGroup& group) const {
  GroupContext context(group, deadline);
  v1::PullRequest request;
  request.set_job_id(job_ids_[server]);
  request.set_fingerprint(fingerprint());
  request.set_begin(begin);
  request.set_end(end);
  request.set_dtype(DTypeToProto(dtype));
  request.set_step(step);
  std::unique_ptr<grpc::ClientReader<v1::PullResponse>> reader =
      (*connections_)[server]->depot->PullWeights(context.get(), request);

  const size_t size = DTypeSize(dtype);
  uint64_t received = 0;  // elements; pieces must tile [begin, end) exactly
  absl::Status protocol_error;
  v1::PullResponse response;
  while (reader->Read(&response)) {
    const uint64_t offset = response.offset();
    const size_t payload_bytes = response.payload().size();
    const uint64_t elems = payload_bytes / size;
    if (payload_bytes % size != 0 || offset < begin || offset > end ||
        elems > end - offset || received + elems > end - begin) {
      protocol_error = absl::InternalError(absl::StrCat(
          "PullWeights: piece at offset ", offset, " with ", payload_bytes,
          " payload bytes does not fit the requested range [", begin, ", ", end,
          ") of ", std::string(DTypeName(dtype))));
      context.get()->TryCancel();
      break;
    }
    std::memcpy(static_cast<char*>(out) + (offset - begin) * size,
                response.payload().data(), payload_bytes);
    received += elems;
  }
  const grpc::Status status = reader->Finish();
  if (!protocol_error.ok()) return protocol_error;
  if (!status.ok()) return FromGrpcStatus(status);
  if (received != end - begin) {
    return absl::InternalError(
        absl::StrCat("PullWeights: server sent ", received, " of the ",
                     end - begin, " elements of [", begin, ", ", end, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ServerJobStatus>> JobImpl::Status(
    bool with_checksum) {
  std::vector<ServerJobStatus> statuses(plan().num_servers());
  const absl::Time deadline = absl::Now() + options_.rpc_timeout;
  absl::Status status = RunOnServers(
      *connections_, AllServers(statuses.size()),
      [&](uint32_t server, CallGroup& group) {
        GroupContext context(group, deadline);
        absl::StatusOr<ServerJobStatus> status =
            QueryStatus(server, with_checksum, context.get());
        if (!status.ok()) return status.status();
        statuses[server] = *std::move(status);
        return absl::OkStatus();
      });
  if (!status.ok()) return status;
  return statuses;
}

absl::StatusOr<uint64_t> JobImpl::Checkpoint() {
  // A checkpoint writes the whole shard: give it the step's deadline.
  const absl::Time deadline = absl::Now() + options_.step_timeout;
  const std::vector<uint32_t> servers = ServersWithChunks();
  std::vector<uint64_t> steps(plan().num_servers(), 0);
  absl::Status status = RunOnServers(
      *connections_, servers, [&](uint32_t server, CallGroup& group) {
        GroupContext context(group, deadline);
        v1::CheckpointRequest request;
        request.set_job_id(job_ids_[server]);
        request.set_fingerprint(fingerprint());
        v1::CheckpointResponse response;
        absl::Status rpc = FromGrpcStatus(
            (*connections_)[server]->depot->Checkpoint(context.get(), request,
                                                       &response));
        steps[server] = response.step();
        return rpc;
      });
  if (!status.ok()) return status;
  for (uint32_t server : servers) {
    if (steps[server] != steps[servers.front()]) {
      std::vector<std::string> each;
      for (uint32_t s : servers) {
        each.push_back(absl::StrCat((*connections_)[s]->address, " at step ",
                                    steps[s]));
      }
      return absl::FailedPreconditionError(absl::StrCat(
          "the servers checkpointed different steps (",
          absl::StrJoin(each, ", "),
          "): a step was in flight; take checkpoints between steps"));
    }
  }
  return servers.empty() ? uint64_t{0} : steps[servers.front()];
}

absl::Status JobImpl::Delete() {
  const absl::Time deadline = absl::Now() + options_.rpc_timeout;
  return RunOnServers(
      *connections_, AllServers(plan().num_servers()),
      [&](uint32_t server, CallGroup& group) {
        GroupContext context(group, deadline);
        v1::DeleteJobRequest request;
        request.set_job_id(job_ids_[server]);
        request.set_fingerprint(fingerprint());
        v1::DeleteJobResponse response;
        return FromGrpcStatus((*connections_)[server]->depot->DeleteJob(
            context.get(), request, &response));
      });
}

}  // namespace depot::client_internal
