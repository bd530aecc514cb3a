// JobImpl::SaveState and LoadState: the whole optimizer state through the
// servers' ExportState / ImportState RPCs, in the blob of state_blob.h; and
// ReadStatePart and PatchStatePart, a part of it by the same RPCs.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "call_group.h"
#include "depot/job_config_diff.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/sync_stream.h"
#include "job_impl.h"
#include "state_blob.h"
#include "wire/wire.h"

namespace depot::client_internal {

absl::StatusOr<std::string> JobImpl::SaveState() {
  StateBlob blob;
  blob.fingerprint = StateFingerprint(config());
  JobConfigToProto(config(), &blob.spec.emplace());
  std::vector<std::vector<uint64_t>> every(plan().num_servers());
  if (absl::Status s =
          ExportFromServers(ServersWithChunks(), every, blob.servers);
      !s.ok()) {
    return s;
  }
  // One step for the whole state: a step applied on some chunks and not on
  // others (a step in flight, or a server that restarted behind the others)
  // would save a state no uninterrupted run ever had.
  const v1::StateChunk* lowest = nullptr;
  const v1::StateChunk* highest = nullptr;
  uint32_t lowest_server = 0, highest_server = 0;
  for (uint32_t server = 0; server < blob.servers.size(); ++server) {
    for (const v1::StateChunk& chunk : blob.servers[server]) {
      if (lowest == nullptr || chunk.applied_step() < lowest->applied_step()) {
        lowest = &chunk;
        lowest_server = server;
      }
      if (highest == nullptr ||
          chunk.applied_step() > highest->applied_step()) {
        highest = &chunk;
        highest_server = server;
      }
    }
  }
  if (lowest != nullptr && lowest->applied_step() != highest->applied_step()) {
    return absl::AbortedError(absl::StrCat(
        "SaveState: the job's chunks are at different steps (chunk ",
        lowest->index(), " on server ", (*connections_)[lowest_server]->address,
        " at step ", lowest->applied_step(), ", chunk ", highest->index(),
        " on server ", (*connections_)[highest_server]->address, " at step ",
        highest->applied_step(),
        "): a step is in flight, or a server restarted behind the others; "
        "save between steps, after Reconcile if a server restarted"));
  }
  return EncodeStateBlob(blob);
}

std::string JobImpl::SavedConfigDifferences(const StateBlob& blob) const {
  if (blob.spec.has_value()) {
    absl::StatusOr<JobConfig> saved = JobConfigFromProto(*blob.spec);
    if (saved.ok()) {
      saved->name = config().name;  // a state loads into a job of any name
      if (blob.version >= 3) saved->num_servers = config().num_servers;
      const std::string differences = DescribeJobConfigDifferences(
          *saved, "checkpoint", config(), "this job");
      if (!differences.empty()) return differences;
    }
  }
  // A state saved before the blob carried its config, or one whose config
  // this client cannot read: only the fingerprints can be compared.
  return absl::StrFormat("state fingerprint %#x, this job's %#x",
                         blob.fingerprint,
                         StateFingerprint(config(), blob.version));
}

absl::StatusOr<StateBlob> JobImpl::DecodeOwnStateBlob(
    const std::string& bytes) const {
  absl::StatusOr<StateBlob> blob = DecodeStateBlob(bytes);
  if (!blob.ok()) return blob.status();
  if (blob->fingerprint != StateFingerprint(config(), blob->version)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the saved state is of another job config (",
        SavedConfigDifferences(*blob),
        "): load it into a job with the config it was saved from (the name "
        "and, from state format 3 on, the number of servers may differ)"));
  }
  if (blob->servers.size() == plan().num_servers()) return blob;
  if (blob->version < 3) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the saved state (format version ", blob->version, ") is of ",
        blob->servers.size(), " servers and this job has ",
        plan().num_servers(), ": states saved before format 3 load only onto "
        "as many servers; load it into a job of ", blob->servers.size(),
        " servers and save it again to move it"));
  }
  // The same chunks (the chunk size is in the fingerprint), owned by other
  // servers: each goes to its owner in this job's plan, in index order.
  std::vector<std::vector<v1::StateChunk>> owned(plan().num_servers());
  for (std::vector<v1::StateChunk>& server : blob->servers) {
    for (v1::StateChunk& chunk : server) {
      if (chunk.index() >= plan().num_chunks()) {
        return absl::DataLossError(absl::StrCat(
            "the saved state does not fit the job's shard plan: chunk ",
            chunk.index(), " of ", plan().num_chunks()));
      }
      owned[plan().ServerOfChunk(chunk.index())].push_back(std::move(chunk));
    }
  }
  blob->servers = std::move(owned);
  return blob;
}

absl::Status JobImpl::LoadState(const std::string& bytes) {
  absl::StatusOr<StateBlob> blob = DecodeOwnStateBlob(bytes);
  if (!blob.ok()) return blob.status();
  return ImportOnServers(ServersWithChunks(), blob->servers, /*patch=*/false);
}

absl::Status JobImpl::ExportFromServers(
    const std::vector<uint32_t>& servers,
    const std::vector<std::vector<uint64_t>>& wanted,
    std::vector<std::vector<v1::StateChunk>>& out) {
  out.assign(plan().num_servers(), {});
  const absl::Time deadline = absl::Now() + options_.step_timeout;
  return RunOnServers(
      *connections_, servers,
      [&](uint32_t server, CallGroup& group) -> absl::Status {
        GroupContext context(group, deadline);
        v1::ExportStateRequest request;
        request.set_job_id(job_ids_[server]);
        request.set_fingerprint(fingerprint());
        for (const uint64_t c : wanted[server]) request.add_chunks(c);
        std::unique_ptr<grpc::ClientReader<v1::StateChunk>> reader =
            (*connections_)[server]->depot->ExportState(context.get(), request);
        std::vector<v1::StateChunk>& chunks = out[server];
        v1::StateChunk chunk;
        while (reader->Read(&chunk)) chunks.push_back(std::move(chunk));
        if (const grpc::Status rpc = reader->Finish(); !rpc.ok()) {
          return FromGrpcStatus(rpc);
        }
        const uint64_t expected = wanted[server].empty()
                                      ? plan().shard(server).num_chunks()
                                      : wanted[server].size();
        if (chunks.size() != expected) {
          return absl::InternalError(
              absl::StrCat("ExportState: server sent ", chunks.size(),
                           " chunks of the ", expected, " asked for"));
        }
        return absl::OkStatus();
      });
}

absl::Status JobImpl::ImportOnServers(
    const std::vector<uint32_t>& servers,
    std::vector<std::vector<v1::StateChunk>>& chunks, bool patch,
    uint64_t capture_step) {
  const absl::Time deadline = absl::Now() + options_.step_timeout;
  return RunOnServers(
      *connections_, servers,
      [&](uint32_t server, CallGroup& group) -> absl::Status {
        GroupContext context(group, deadline);
        v1::ImportStateResponse response;
        std::unique_ptr<grpc::ClientWriter<v1::ImportStateRequest>> writer =
            (*connections_)[server]->depot->ImportState(context.get(),
                                                        &response);
        v1::ImportStateRequest request;
        request.mutable_header()->set_job_id(job_ids_[server]);
        request.mutable_header()->set_fingerprint(fingerprint());
        request.mutable_header()->set_patch(patch);
        request.mutable_header()->set_capture_step(capture_step);
        bool writing = writer->Write(request);
        for (v1::StateChunk& chunk : chunks[server]) {
          if (!writing) break;
          *request.mutable_chunk() = std::move(chunk);
          writing = writer->Write(request);
        }
        if (writing) writer->WritesDone();
        if (const grpc::Status rpc = writer->Finish(); !rpc.ok()) {
          return FromGrpcStatus(rpc);
        }
        return absl::OkStatus();
      });
}

namespace {

absl::Status BadBlob(const std::string& what) {
  return absl::DataLossError(
      absl::StrCat("the saved state does not fit the job's shard plan: ", what));
}

}  // namespace

absl::StatusOr<FlatState> JobImpl::DecodeState(const std::string& bytes) const {
  absl::StatusOr<StateBlob> blob = DecodeOwnStateBlob(bytes);
  if (!blob.ok()) return blob.status();
  const OptimizerConfig slot_config = JobSlotConfig(config());
  const int slots = OptimizerStateSlots(slot_config);
  const uint64_t n = total_elems();
  FlatState state;
  state.master.assign(n, 0.0f);
  state.slots.assign(slots, std::vector<float>(n, 0.0f));
  state.tensor_steps.assign(layout().tensors().size(), 0);
  std::vector<bool> seen(plan().num_chunks(), false);
  bool first = true;
  for (const std::vector<v1::StateChunk>& server : blob->servers) {
    for (const v1::StateChunk& chunk : server) {
      if (chunk.index() >= plan().num_chunks() || seen[chunk.index()]) {
        return BadBlob(absl::StrCat("chunk ", chunk.index(),
                                    " is outside the plan or listed twice"));
      }
      seen[chunk.index()] = true;
      const ChunkRange range = plan().chunk(chunk.index());
      if (chunk.master().size() != range.size() * sizeof(float) ||
          chunk.slots_size() != slots) {
        return BadBlob(absl::StrCat("chunk ", chunk.index(),
                                    " has the wrong size or slot count"));
      }
      if (first) {
        state.applied_step = chunk.applied_step();
        first = false;
      }
      std::memcpy(state.master.data() + range.begin, chunk.master().data(),
                  chunk.master().size());
      for (int k = 0; k < slots; ++k) {
        const DType dtype = OptimizerSlotDType(slot_config, k);
        if (chunk.slots(k).size() != range.size() * DTypeSize(dtype)) {
          return BadBlob(absl::StrCat("slot ", k, " of chunk ", chunk.index(),
                                      " has the wrong size"));
        }
        ConvertToFloat(dtype, chunk.slots(k).data(),
                       state.slots[k].data() + range.begin, range.size());
      }
      const std::vector<Segment> segments =
          layout().SegmentsIn(range.begin, range.end);
      if (chunk.tensor_steps_size() != 0 &&
          static_cast<size_t>(chunk.tensor_steps_size()) != segments.size()) {
        return BadBlob(absl::StrCat("chunk ", chunk.index(), " has ",
                                    chunk.tensor_steps_size(),
                                    " tensor counts for ", segments.size(),
                                    " segments"));
      }
      for (size_t i = 0; i < segments.size(); ++i) {
        state.tensor_steps[segments[i].tensor_index] =
            chunk.tensor_steps_size() != 0 ? chunk.tensor_steps(i)
                                           : chunk.optimizer_step();
      }
    }
  }
  for (size_t c = 0; c < seen.size(); ++c) {
    if (!seen[c]) return BadBlob(absl::StrCat("chunk ", c, " is missing"));
  }
  return state;
}

absl::Status JobImpl::CheckStateArrays(const char* what, const FlatState& state,
                                       uint64_t n) const {
  const int slots = OptimizerStateSlots(JobSlotConfig(config()));
  if (state.master.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": master has ", state.master.size(), " elements, needs ", n));
  }
  if (state.slots.size() != static_cast<size_t>(slots)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", state.slots.size(),
                     " slot arrays, the job's optimizer keeps ", slots));
  }
  for (int k = 0; k < slots; ++k) {
    if (state.slots[k].size() != n) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": slot ", k, " has ", state.slots[k].size(),
                       " elements, needs ", n));
    }
  }
  if (state.tensor_steps.size() != layout().tensors().size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", state.tensor_steps.size(),
                     " tensor step counts, the job has ",
                     layout().tensors().size(), " tensors"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> JobImpl::EncodeState(const FlatState& state) const {
  const OptimizerConfig slot_config = JobSlotConfig(config());
  const int slots = OptimizerStateSlots(slot_config);
  const uint64_t n = total_elems();
  if (absl::Status s = CheckStateArrays("EncodeState", state, n); !s.ok()) {
    return s;
  }
  for (size_t t = 0; t < state.tensor_steps.size(); ++t) {
    if (state.tensor_steps[t] > state.applied_step) {
      return absl::InvalidArgumentError(absl::StrCat(
          "EncodeState: tensor ", t, " has step count ", state.tensor_steps[t],
          ", above the applied step ", state.applied_step));
    }
  }
  StateBlob blob;
  blob.fingerprint = StateFingerprint(config());
  blob.servers.resize(plan().num_servers());
  std::vector<float> padded;
  for (uint32_t server = 0; server < plan().num_servers(); ++server) {
    const ShardRange& shard = plan().shard(server);
    for (uint64_t index = shard.first_chunk; index < shard.end_chunk;
         ++index) {
      const ChunkRange range = plan().chunk(index);
      const std::vector<Segment> segments =
          layout().SegmentsIn(range.begin, range.end);
      v1::StateChunk& chunk = blob.servers[server].emplace_back();
      chunk.set_index(index);
      chunk.set_applied_step(state.applied_step);
      uint64_t largest = 0;
      for (const Segment& segment : segments) {
        const uint64_t count = state.tensor_steps[segment.tensor_index];
        chunk.add_tensor_steps(count);
        largest = std::max(largest, count);
      }
      chunk.set_optimizer_step(largest);
      // Padding holds no state: zero whatever the arrays have there.
      const auto padded_copy = [&](const std::vector<float>& source) {
        padded.assign(range.size(), 0.0f);
        for (const Segment& segment : segments) {
          std::copy(source.begin() + segment.begin,
                    source.begin() + segment.end,
                    padded.begin() + (segment.begin - range.begin));
        }
        return padded.data();
      };
      chunk.set_master(reinterpret_cast<const char*>(padded_copy(state.master)),
                       range.size() * sizeof(float));
      for (int k = 0; k < slots; ++k) {
        const DType dtype = OptimizerSlotDType(slot_config, k);
        std::string bytes(range.size() * DTypeSize(dtype), '\0');
        ConvertFromFloat(padded_copy(state.slots[k]), dtype, bytes.data(),
                         range.size());
        *chunk.add_slots() = std::move(bytes);
      }
    }
  }
  return EncodeStateBlob(blob);
}

absl::Status JobImpl::CheckPartRange(uint64_t begin, uint64_t end) const {
  if (begin < end && end <= total_elems()) return absl::OkStatus();
  return absl::OutOfRangeError(absl::StrCat(
      "a part of the state is [begin, end) with begin < end <= ", total_elems(),
      " (the job's elements); got [", begin, ", ", end, ")"));
}

absl::StatusOr<std::vector<v1::StateChunk>> JobImpl::ExportPart(uint64_t begin,
                                                                uint64_t end) {
  if (absl::Status s = CheckPartRange(begin, end); !s.ok()) return s;
  const uint64_t first = begin / plan().chunk_elems();
  const uint64_t last = (end - 1) / plan().chunk_elems();
  std::vector<std::vector<uint64_t>> wanted(plan().num_servers());
  std::vector<uint32_t> servers;
  for (uint64_t c = first; c <= last; ++c) {
    const uint32_t server = plan().ServerOfChunk(c);
    if (wanted[server].empty()) servers.push_back(server);
    wanted[server].push_back(c);
  }
  std::vector<std::vector<v1::StateChunk>> read;
  if (absl::Status s = ExportFromServers(servers, wanted, read); !s.ok()) {
    return s;
  }
  const OptimizerConfig slot_config = JobSlotConfig(config());
  const int slots = OptimizerStateSlots(slot_config);
  std::vector<v1::StateChunk> chunks;
  for (uint64_t c = first; c <= last; ++c) {
    // Each server's chunks came in index order.
    std::vector<v1::StateChunk>& from = read[plan().ServerOfChunk(c)];
    v1::StateChunk& chunk = from[c - wanted[plan().ServerOfChunk(c)].front()];
    if (chunk.index() != c) {
      return absl::InternalError(absl::StrCat("ExportState: server sent chunk ",
                                              chunk.index(), " for chunk ", c));
    }
    bool sizes_ok =
        chunk.master().size() == plan().chunk(c).size() * sizeof(float) &&
        chunk.slots_size() == slots;
    for (int k = 0; sizes_ok && k < slots; ++k) {
      sizes_ok = chunk.slots(k).size() ==
                 plan().chunk(c).size() *
                     DTypeSize(OptimizerSlotDType(slot_config, k));
    }
    if (!sizes_ok) {
      return absl::InternalError(absl::StrCat(
          "ExportState: chunk ", c, " has the wrong size or slot count"));
    }
    if (!chunks.empty() &&
        chunk.applied_step() != chunks.front().applied_step()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the job's chunks are at different steps (chunk ",
          chunks.front().index(), " at step ", chunks.front().applied_step(),
          ", chunk ", c, " at step ", chunk.applied_step(),
          "): a step is in flight; read or patch the state between steps"));
    }
    chunks.push_back(std::move(chunk));
  }
  return chunks;
}

absl::StatusOr<FlatState> JobImpl::ReadStatePart(uint64_t begin, uint64_t end) {
  absl::StatusOr<std::vector<v1::StateChunk>> chunks = ExportPart(begin, end);
  if (!chunks.ok()) return chunks.status();
  const OptimizerConfig slot_config = JobSlotConfig(config());
  const int slots = OptimizerStateSlots(slot_config);
  FlatState part;
  part.applied_step = chunks->front().applied_step();
  part.master.assign(end - begin, 0.0f);
  part.slots.assign(slots, std::vector<float>(end - begin, 0.0f));
  part.tensor_steps.assign(layout().tensors().size(), 0);
  std::vector<float> widened;
  for (const v1::StateChunk& chunk : *chunks) {
    part.lacks_worker_state |= chunk.lacks_worker_state();
    const ChunkRange range = plan().chunk(chunk.index());
    const uint64_t lo = std::max(begin, range.begin);
    const uint64_t hi = std::min(end, range.end);
    std::memcpy(part.master.data() + (lo - begin),
                chunk.master().data() + (lo - range.begin) * sizeof(float),
                (hi - lo) * sizeof(float));
    for (int k = 0; k < slots; ++k) {
      const DType dtype = OptimizerSlotDType(slot_config, k);
      widened.resize(range.size());
      ConvertToFloat(dtype, chunk.slots(k).data(), widened.data(),
                     range.size());
      std::copy(widened.begin() + (lo - range.begin),
                widened.begin() + (hi - range.begin),
                part.slots[k].begin() + (lo - begin));
    }
    const std::vector<Segment> segments =
        layout().SegmentsIn(range.begin, range.end);
    for (size_t i = 0; i < segments.size(); ++i) {
      if (segments[i].end <= begin || segments[i].begin >= end) continue;
      part.tensor_steps[segments[i].tensor_index] =
          chunk.tensor_steps_size() != 0 ? chunk.tensor_steps(i)
                                         : chunk.optimizer_step();
    }
  }
  return part;
}

absl::Status JobImpl::PatchStatePart(uint64_t begin, uint64_t end,
                                     const FlatState& part) {
  // Before the arrays, whose size the range gives.
  if (absl::Status s = CheckPartRange(begin, end); !s.ok()) return s;
  const OptimizerConfig slot_config = JobSlotConfig(config());
  const int slots = OptimizerStateSlots(slot_config);
  if (absl::Status s = CheckStateArrays("PatchStatePart", part, end - begin);
      !s.ok()) {
    return s;
  }
  absl::StatusOr<std::vector<v1::StateChunk>> chunks = ExportPart(begin, end);
  if (!chunks.ok()) return chunks.status();
  if (chunks->front().applied_step() != part.applied_step) {
    return absl::FailedPreconditionError(absl::StrCat(
        "PatchStatePart: the servers are at step ",
        chunks->front().applied_step(), " and the part is of step ",
        part.applied_step, ": a part is written at the step it was taken at"));
  }
  std::vector<std::vector<v1::StateChunk>> patches(plan().num_servers());
  std::vector<uint32_t> servers;
  std::vector<float> widened;
  for (v1::StateChunk& chunk : *chunks) {
    const ChunkRange range = plan().chunk(chunk.index());
    const std::vector<Segment> segments =
        layout().SegmentsIn(range.begin, range.end);
    if (chunk.tensor_steps_size() == 0) {
      for (size_t i = 0; i < segments.size(); ++i) {
        chunk.add_tensor_steps(chunk.optimizer_step());
      }
    }
    std::string& master = *chunk.mutable_master();
    for (size_t i = 0; i < segments.size(); ++i) {
      const Segment& segment = segments[i];
      const uint64_t lo = std::max(begin, segment.begin);
      const uint64_t hi = std::min(end, segment.end);
      if (lo >= hi) continue;
      const uint64_t count = part.tensor_steps[segment.tensor_index];
      if (count > part.applied_step) {
        return absl::InvalidArgumentError(absl::StrCat(
            "PatchStatePart: tensor ", segment.tensor_index, " has step count ",
            count, ", above the applied step ", part.applied_step));
      }
      chunk.set_tensor_steps(static_cast<int>(i), count);
      std::memcpy(master.data() + (lo - range.begin) * sizeof(float),
                  part.master.data() + (lo - begin), (hi - lo) * sizeof(float));
    }
    for (int k = 0; k < slots; ++k) {
      // Widened, overlaid and narrowed again: a bf16 slot's values outside
      // the part come back as they were (bf16 to fp32 and back is exact).
      const DType dtype = OptimizerSlotDType(slot_config, k);
      widened.resize(range.size());
      std::string& bytes = *chunk.mutable_slots(k);
      ConvertToFloat(dtype, bytes.data(), widened.data(), range.size());
      for (const Segment& segment : segments) {
        const uint64_t lo = std::max(begin, segment.begin);
        const uint64_t hi = std::min(end, segment.end);
        if (lo >= hi) continue;
        std::copy(part.slots[k].begin() + (lo - begin),
                  part.slots[k].begin() + (hi - begin),
                  widened.begin() + (lo - range.begin));
      }
      ConvertFromFloat(widened.data(), dtype, bytes.data(), range.size());
    }
    uint64_t largest = 0;
    for (const uint64_t count : chunk.tensor_steps()) {
      largest = std::max(largest, count);
    }
    chunk.set_optimizer_step(largest);
    // The part is the workers' state, written at the chunk's step.
    chunk.set_lacks_worker_state(false);
    const uint32_t server = plan().ServerOfChunk(chunk.index());
    if (patches[server].empty()) servers.push_back(server);
    patches[server].push_back(std::move(chunk));
  }
  return ImportOnServers(servers, patches, /*patch=*/true);
}

absl::Status JobImpl::PatchCapturePart(uint64_t step, uint64_t begin,
                                       uint64_t end, const FlatState& part) {
  if (absl::Status s = CheckPartRange(begin, end); !s.ok()) return s;
  if (absl::Status s = CheckStateArrays("PatchCapturePart", part, end - begin);
      !s.ok()) {
    return s;
  }
  const OptimizerConfig slot_config = JobSlotConfig(config());
  const int slots = OptimizerStateSlots(slot_config);
  std::vector<std::vector<v1::StateChunk>> patches(plan().num_servers());
  std::vector<uint32_t> servers;
  for (uint64_t c = begin / plan().chunk_elems();
       c <= (end - 1) / plan().chunk_elems(); ++c) {
    // The part's elements over a chunk of zeros: the server takes only
    // those of the step's sum-only tensors.
    const ChunkRange range = plan().chunk(c);
    const uint64_t lo = std::max(begin, range.begin);
    const uint64_t hi = std::min(end, range.end);
    v1::StateChunk chunk;
    chunk.set_index(c);
    chunk.set_applied_step(step);
    std::vector<float> values(range.size(), 0.0f);
    std::copy(part.master.begin() + (lo - begin),
              part.master.begin() + (hi - begin),
              values.begin() + (lo - range.begin));
    chunk.set_master(values.data(), values.size() * sizeof(float));
    for (int k = 0; k < slots; ++k) {
      std::fill(values.begin(), values.end(), 0.0f);
      std::copy(part.slots[k].begin() + (lo - begin),
                part.slots[k].begin() + (hi - begin),
                values.begin() + (lo - range.begin));
      const DType dtype = OptimizerSlotDType(slot_config, k);
      std::string bytes(range.size() * DTypeSize(dtype), '\0');
      ConvertFromFloat(values.data(), dtype, bytes.data(), range.size());
      *chunk.add_slots() = std::move(bytes);
    }
    uint64_t largest = 0;
    for (const Segment& segment : layout().SegmentsIn(range.begin, range.end)) {
      const bool in_part = segment.begin < end && segment.end > begin;
      const uint64_t count =
          in_part ? part.tensor_steps[segment.tensor_index] : 0;
      if (count > step) {
        return absl::InvalidArgumentError(
            absl::StrCat("PatchCapturePart: tensor ", segment.tensor_index,
                         " has step count ", count, ", above the step ", step));
      }
      chunk.add_tensor_steps(count);
      largest = std::max(largest, count);
    }
    chunk.set_optimizer_step(largest);
    const uint32_t server = plan().ServerOfChunk(c);
    if (patches[server].empty()) servers.push_back(server);
    patches[server].push_back(std::move(chunk));
  }
  return ImportOnServers(servers, patches, /*patch=*/true, step);
}

}  // namespace depot::client_internal
