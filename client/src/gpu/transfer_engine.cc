// TransferEngine: creating the engine (its buffers, pinned rings, events
// and routes) and its public methods, over TransferEngine::Impl
// (transfer_engine_impl.h says where the rest lives).
#include "gpu/transfer_engine_impl.h"

namespace depot::gpu {

using client_internal::StreamedStep;

absl::Status TransferEngine::Impl::Init() {
  if (collective_ != nullptr &&
      options_.collective_timeout > absl::ZeroDuration()) {
    absl::StatusOr<std::unique_ptr<WatchedCollective>> watched =
        WatchedCollective::Create(device_, *collective_,
                                  options_.collective_timeout,
                                  [this](const absl::Status& status) {
                                    OnCollectiveExpired(status);
                                  });
    if (!watched.ok()) return watched.status();
    watched_ = *std::move(watched);
    collective_ = watched_.get();
  }
  const uint64_t padded = partition_.padded_elems();
  const uint64_t chunk = partition_.chunk_elems();
  const bool dpu = options_.delayed_update;
  for (int i = 0; i < (dpu ? 2 : 1); ++i) {
    absl::StatusOr<std::unique_ptr<Buffer>> buffer =
        device_.Allocate(padded * grad_size_);
    if (!buffer.ok()) return buffer.status();
    grads_[i] = *std::move(buffer);
  }
  for (int i = 0; i < (dpu ? 3 : 1); ++i) {
    absl::StatusOr<std::unique_ptr<Buffer>> buffer =
        device_.Allocate(padded * weight_size_);
    if (!buffer.ok()) return buffer.status();
    (i == 0 ? live_ : incoming_[i - 1]) = *std::move(buffer);
  }
  // An offload fraction: the kept tensors are sum-only, so that the servers
  // know them (a two-phase step's norm and decision cover them, their
  // checkpoint captures ask for their state). With several nodes the
  // servers send their sums, and an H2D slot also carries a chunk's fp32
  // sums (AcceptGradSum); one node holds them already (omit_sums).
  sum_only_ = options_.offload_fraction < 1.0;
  sums_from_servers_ = sum_only_ && job_.config().num_workers > 1;
  const size_t h2d_elem_bytes =
      sums_from_servers_ ? std::max(weight_size_, sizeof(float)) : weight_size_;
  for (auto [ring, slots, size] :
       {std::tuple{&d2h_, options_.d2h_slots, grad_size_},
        std::tuple{&h2d_, options_.h2d_slots, h2d_elem_bytes}}) {
    ring->slots = slots;
    ring->slot_bytes = chunk * size;
    absl::StatusOr<std::unique_ptr<Buffer>> buffer =
        device_.AllocatePinned(ring->slot_bytes * slots);
    if (!buffer.ok()) return buffer.status();
    ring->memory = *std::move(buffer);
    for (int i = slots - 1; i >= 0; --i) ring->free.push_back(i);
  }
  for (std::unique_ptr<Stream>* stream : {&comm_, &d2h_stream_, &h2d_stream_}) {
    absl::StatusOr<std::unique_ptr<Stream>> created = device_.CreateStream();
    if (!created.ok()) return created.status();
    *stream = *std::move(created);
  }
  const uint64_t buckets = partition_.num_buckets();
  std::vector<std::vector<std::unique_ptr<Event>>*> sets;
  for (int p = 0; p < 2; ++p) {
    for (auto* events :
         {&ready_[p], &rs_done_[p], &h2d_done_[p], &weights_ready_[p]}) {
      sets.push_back(events);
    }
  }
  for (auto* events : sets) {
    for (uint64_t b = 0; b < buckets; ++b) {
      absl::StatusOr<std::unique_ptr<Event>> event = device_.CreateEvent();
      if (!event.ok()) return event.status();
      events->push_back(*std::move(event));
    }
  }
  applied_step_.assign(buckets, 0);
  if (collective_ != nullptr) {
    absl::StatusOr<std::unique_ptr<Buffer>> flags =
        device_.Allocate(3 * sizeof(float));
    if (!flags.ok()) return flags.status();
    node_flags_ = *std::move(flags);
    absl::StatusOr<std::unique_ptr<Buffer>> constants =
        device_.Allocate(2 * sizeof(float));
    if (!constants.ok()) return constants.status();
    node_constants_ = *std::move(constants);
    static constexpr float kZeroOne[2] = {0.0f, 1.0f};
    absl::Status s =
        device_.CopyAsync(*comm_, node_constants_->data(), kZeroOne,
                          sizeof(kZeroOne), CopyKind::kHostToDevice);
    if (s.ok()) s = device_.SynchronizeStream(*comm_);
    if (!s.ok()) return s;
    for (std::unique_ptr<Event>& event : node_verdict_) {
      absl::StatusOr<std::unique_ptr<Event>> created = device_.CreateEvent();
      if (!created.ok()) return created.status();
      event = *std::move(created);
    }
    absl::StatusOr<std::unique_ptr<Stream>> stream = device_.CreateStream();
    if (!stream.ok()) return stream.status();
    node_read_ = *std::move(stream);
  }
  // This rank's chunks, dealt to its streams: per server, round-robin.
  const ShardPlan& plan = job_.plan();
  route_of_chunk_.assign(plan.num_chunks(), UINT32_MAX);
  owned_in_bucket_.assign(buckets, 0);
  std::vector<std::vector<uint32_t>> server_routes(plan.num_servers());
  std::vector<uint64_t> dealt(plan.num_servers(), 0);
  for (uint64_t b = 0; b < buckets; ++b) {
    const ChunkSpan owned = partition_.owned(b, options_.local_rank);
    owned_in_bucket_[b] = owned.size();
    for (uint64_t c = owned.first; c < owned.end; ++c) {
      const uint32_t server = plan.ServerOfChunk(c);
      std::vector<uint32_t>& mine = server_routes[server];
      const uint64_t k = dealt[server]++ % options_.streams_per_server;
      if (k == mine.size()) {
        mine.push_back(static_cast<uint32_t>(routes_.size()));
        StreamedStep::Route route;
        route.server = server;
        route.first_chunk = plan.shard(server).first_chunk;
        route.end_chunk = plan.shard(server).end_chunk;
        routes_.push_back(route);
      }
      route_of_chunk_[c] = mine[k];
      ++routes_[mine[k]].chunks;
    }
  }
  if (absl::Status s = InitGpuTensors(); !s.ok()) return s;
  // A two-phase step: one stream to every server with chunks, also where
  // this rank owns none (it still receives the GradStats and commits).
  route_two_phase_of_chunk_.assign(plan.num_chunks(), UINT32_MAX);
  for (uint32_t server = 0; server < plan.num_servers(); ++server) {
    const ShardRange& shard = plan.shard(server);
    if (shard.num_chunks() == 0) continue;
    StreamedStep::Route route;
    route.server = server;
    route.first_chunk = shard.first_chunk;
    route.end_chunk = shard.end_chunk;
    for (uint64_t c = shard.first_chunk; c < shard.end_chunk; ++c) {
      if (partition_.OwnerOfChunk(c) != options_.local_rank) continue;
      route_two_phase_of_chunk_[c] =
          static_cast<uint32_t>(routes_two_phase_.size());
      ++route.chunks;
    }
    routes_two_phase_.push_back(route);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<TransferEngine>> TransferEngine::Create(
    Job& job, Device& device, Collective* collective,
    TransferEngineOptions options) {
  if (options.local_ranks == 0 || options.local_rank >= options.local_ranks) {
    return absl::InvalidArgumentError(
        absl::StrCat("TransferEngine: local_rank ", options.local_rank, " of ",
                     options.local_ranks, " local ranks"));
  }
  if (options.local_ranks > 1 &&
      (collective == nullptr ||
       collective->size() != static_cast<int>(options.local_ranks) ||
       collective->rank() != static_cast<int>(options.local_rank))) {
    return absl::InvalidArgumentError(
        absl::StrCat("TransferEngine: local rank ", options.local_rank, " of ",
                     options.local_ranks,
                     " needs the node's collective with that rank and size"));
  }
  if (options.d2h_slots < 1 || options.h2d_slots < 1 ||
      options.streams_per_server < 1) {
    return absl::InvalidArgumentError(
        "TransferEngine: d2h_slots, h2d_slots and streams_per_server must be "
        ">= 1");
  }
  if (options.collective_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "TransferEngine: collective_timeout must be >= 0 (0: no limit)");
  }
  if (!(options.offload_fraction >= 0.0 && options.offload_fraction <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("TransferEngine: offload_fraction must be in [0, 1], got ",
                     options.offload_fraction));
  }
  // A job that has applied steps: the kept tensors' state is not the
  // servers' (they never update it), so it is missing until loaded.
  std::string kept_state_missing;
  if (options.offload_fraction < 1.0) {
    if (options.device_optimizer == nullptr) {
      return absl::InvalidArgumentError(
          "TransferEngine: offload_fraction < 1 needs a device_optimizer");
    }
    absl::StatusOr<std::vector<ServerJobStatus>> statuses =
        job.Status(/*with_checksum=*/false);
    if (!statuses.ok()) return statuses.status();
    for (const ServerJobStatus& status : *statuses) {
      if (status.step != 0 && kept_state_missing.empty()) {
        kept_state_missing = absl::StrCat(
            "server ", status.server, " has applied step ", status.step,
            ", and the optimizer state of the tensors kept on the GPU "
            "(offload_fraction < 1) is not the servers': load a saved state "
            "(WriteGpuState, after Job::LoadState of the same state) first");
      }
    }
  }
  if (options.bucket_chunks == 0) {
    options.bucket_chunks = uint64_t{4} * options.local_ranks;
  }
  absl::StatusOr<NodePartition> partition = NodePartition::Create(
      job.plan(), options.local_ranks, options.bucket_chunks);
  if (!partition.ok()) return partition.status();
  auto impl = std::make_unique<Impl>(
      job, device, options.local_ranks > 1 ? collective : nullptr, options,
      *partition);
  if (absl::Status s = impl->Init(); !s.ok()) return s;
  impl->set_kept_state_missing(std::move(kept_state_missing));
  return std::unique_ptr<TransferEngine>(new TransferEngine(std::move(impl)));
}

std::vector<uint32_t> ChooseGpuTensors(const Layout& layout,
                                       double offload_fraction) {
  std::vector<uint32_t> kept;
  if (!(offload_fraction < 1.0)) return kept;
  const double budget = (1.0 - std::max(0.0, offload_fraction)) *
                        static_cast<double>(layout.param_elems());
  uint64_t used = 0;
  for (size_t t = layout.tensors().size(); t-- > 0;) {
    const uint64_t numel = layout.tensors()[t].numel;
    if (static_cast<double>(used + numel) <= budget) {
      used += numel;
      kept.push_back(static_cast<uint32_t>(t));
    }
  }
  std::reverse(kept.begin(), kept.end());
  return kept;
}

TransferEngine::TransferEngine(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}
TransferEngine::~TransferEngine() = default;

const NodePartition& TransferEngine::partition() const {
  return impl_->partition();
}
void* TransferEngine::grads() const { return impl_->grads(); }
void* TransferEngine::grads_of_step(uint64_t step) const {
  return impl_->grads_of_step(step);
}
void* TransferEngine::weights() const { return impl_->weights(); }
uint64_t TransferEngine::pinned_bytes() const { return impl_->pinned_bytes(); }
const std::vector<uint32_t>& TransferEngine::gpu_tensors() const {
  return impl_->gpu_tensors();
}
uint64_t TransferEngine::gpu_state_bytes() const {
  return impl_->gpu_state_bytes();
}
absl::Status TransferEngine::ReadGpuState(const StateArrays& state) {
  return impl_->ReadGpuState(state);
}
absl::Status TransferEngine::WriteGpuState(const StateArrays& state) {
  return impl_->WriteGpuState(state);
}
absl::Status TransferEngine::StoreGpuState() { return impl_->StoreGpuState(); }
absl::Status TransferEngine::RestoreGpuState() {
  return impl_->RestoreGpuState();
}
absl::Status TransferEngine::BeginStep(uint64_t step,
                                       const StepOptions& options) {
  return impl_->BeginStep(step, options);
}
absl::Status TransferEngine::GradientsReady(uint64_t bucket, Stream& stream) {
  return impl_->GradientsReady(bucket, stream);
}
absl::Status TransferEngine::WaitWeights(uint64_t bucket, Stream& stream) {
  return impl_->WaitWeights(bucket, stream);
}
absl::StatusOr<StepResult> TransferEngine::FinishStep() {
  return impl_->FinishStep();
}
CaptureReport TransferEngine::WaitCaptures() {
  return impl_->TakeCaptureReport();
}
absl::Status TransferEngine::CheckNode() { return impl_->CheckNode(); }
absl::Status TransferEngine::SynchronizeNode() {
  return impl_->SynchronizeNode();
}

absl::StatusOr<uint64_t> TransferEngine::AgreeOnStep(uint64_t step) {
  return impl_->AgreeOnStep(step);
}

}  // namespace depot::gpu
