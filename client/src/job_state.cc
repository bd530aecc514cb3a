// JobImpl::SaveState and LoadState: the whole optimizer state through the
// servers' ExportState / ImportState RPCs, in the blob of state_blob.h.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "call_group.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/sync_stream.h"
#include "job_impl.h"
#include "state_blob.h"
#include "wire/wire.h"

namespace depot::client_internal {

absl::StatusOr<std::string> JobImpl::SaveState() {
  StateBlob blob;
  blob.fingerprint = StateFingerprint(config());
  blob.servers.resize(plan().num_servers());
  const absl::Time deadline = absl::Now() + options_.step_timeout;
  absl::Status status = RunOnServers(
      *connections_, ServersWithChunks(),
      [&](uint32_t server, CallGroup& group) -> absl::Status {
        GroupContext context(group, deadline);
        v1::ExportStateRequest request;
        request.set_job_id(job_ids_[server]);
        request.set_fingerprint(fingerprint());
        std::unique_ptr<grpc::ClientReader<v1::StateChunk>> reader =
            (*connections_)[server]->depot->ExportState(context.get(), request);
        std::vector<v1::StateChunk>& chunks = blob.servers[server];
        v1::StateChunk chunk;
        while (reader->Read(&chunk)) chunks.push_back(std::move(chunk));
        if (const grpc::Status rpc = reader->Finish(); !rpc.ok()) {
          return FromGrpcStatus(rpc);
        }
        if (chunks.size() != plan().shard(server).num_chunks()) {
          return absl::InternalError(absl::StrCat(
              "ExportState: server sent ", chunks.size(), " chunks of the ",
              plan().shard(server).num_chunks(), " of its shard"));
        }
        return absl::OkStatus();
      });
  if (!status.ok()) return status;
  return EncodeStateBlob(blob);
}

absl::Status JobImpl::LoadState(const std::string& bytes) {
  absl::StatusOr<StateBlob> blob = DecodeStateBlob(bytes);
  if (!blob.ok()) return blob.status();
  if (blob->fingerprint != StateFingerprint(config()) ||
      blob->servers.size() != plan().num_servers()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "the saved state is of another job config (state fingerprint %#x, "
        "this job's %#x): load it into a job with the config it was saved "
        "from (the name may differ)",
        blob->fingerprint, StateFingerprint(config())));
  }
  const absl::Time deadline = absl::Now() + options_.step_timeout;
  return RunOnServers(
      *connections_, ServersWithChunks(),
      [&](uint32_t server, CallGroup& group) -> absl::Status {
        GroupContext context(group, deadline);
        v1::ImportStateResponse response;
        std::unique_ptr<grpc::ClientWriter<v1::ImportStateRequest>> writer =
            (*connections_)[server]->depot->ImportState(context.get(),
                                                        &response);
        v1::ImportStateRequest request;
        request.mutable_header()->set_job_id(job_ids_[server]);
        request.mutable_header()->set_fingerprint(fingerprint());
        bool writing = writer->Write(request);
        for (v1::StateChunk& chunk : blob->servers[server]) {
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

}  // namespace depot::client_internal
