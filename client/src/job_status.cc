// JobImpl's use of GetJob: one server's status, and what the servers say about
// a step that ran into its deadline.
#include <cstdint>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "depot/step_wait.h"
#include "job_impl.h"
#include "wire/wire.h"

namespace depot::client_internal {
namespace {

// How long a failed step waits for the servers' GetJob answers: a server that
// is slow to say what it waits for is not worth delaying the error much.
constexpr absl::Duration kExplainTimeout = absl::Seconds(5);

}  // namespace

absl::StatusOr<ServerJobStatus> JobImpl::QueryStatus(
    uint32_t server, bool with_checksum, grpc::ClientContext* context) const {
  v1::GetJobRequest request;
  request.set_job_id(job_ids_[server]);
  request.set_with_checksum(with_checksum);
  v1::JobStatus response;
  const grpc::Status rpc =
      (*connections_)[server]->depot->GetJob(context, request, &response);
  if (!rpc.ok()) return FromGrpcStatus(rpc);
  if (response.fingerprint() != fingerprint()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "job %d has fingerprint %#x, expected %#x: the server holds "
        "another job under this id (was it restarted?)",
        job_ids_[server], response.fingerprint(), fingerprint()));
  }
  ServerJobStatus out;
  out.server = (*connections_)[server]->address;
  out.job_id = response.job_id();
  out.step = response.step();
  out.shard_begin = response.shard_begin();
  out.shard_end = response.shard_end();
  out.state_bytes = response.state_bytes();
  out.state_checksum = with_checksum ? response.state_checksum() : 0;
  out.pending_step = response.pending_step();
  out.missing_workers.assign(response.missing_workers().begin(),
                             response.missing_workers().end());
  out.waiting_seconds = response.waiting_seconds();
  return out;
}

absl::Status JobImpl::ExplainStepDeadline(uint64_t step, absl::Time deadline,
                                          const std::vector<uint32_t>& servers,
                                          absl::Status status) const {
  const bool at_deadline =
      absl::IsDeadlineExceeded(status) ||
      (absl::IsCancelled(status) && absl::Now() >= deadline);
  if (!at_deadline) return status;

  std::vector<absl::StatusOr<ServerJobStatus>> statuses(
      servers.size(), absl::UnknownError("not asked"));
  const absl::Time ask_deadline = absl::Now() + kExplainTimeout;
  std::vector<std::thread> threads;
  for (size_t i = 0; i < servers.size(); ++i) {
    threads.emplace_back([&, i] {
      grpc::ClientContext context;
      SetDeadline(&context, ask_deadline);
      statuses[i] = QueryStatus(servers[i], false, &context);
    });
  }
  for (std::thread& thread : threads) thread.join();

  std::vector<ServerStepWait> waits(servers.size());
  for (size_t i = 0; i < servers.size(); ++i) {
    ServerStepWait& wait = waits[i];
    wait.server = (*connections_)[servers[i]]->address;
    wait.status = statuses[i].status();
    if (!statuses[i].ok()) continue;
    wait.completed_step = statuses[i]->step;
    wait.pending_step = statuses[i]->pending_step;
    wait.missing_workers = statuses[i]->missing_workers;
    wait.waiting_seconds = statuses[i]->waiting_seconds;
  }
  const absl::string_view first_error = status.message();
  const std::string message = DescribeStepDeadline(
      step, options_.step_timeout, config().num_workers, waits,
      std::string_view(first_error.data(), first_error.size()));
  return absl::DeadlineExceededError(message);
}

}  // namespace depot::client_internal
