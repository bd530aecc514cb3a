#include "call_group.h"

#include <algorithm>
#include <numeric>
#include <thread>
#include <utility>

namespace depot::client_internal {

void CallGroup::Attach(grpc::ClientContext* context) {
  absl::MutexLock lock(&mu_);
  if (!first_error_.ok()) context->TryCancel();
  contexts_.push_back(context);
}

void CallGroup::Detach(grpc::ClientContext* context) {
  // Under the lock, so that Fail never cancels a context that is being
  // destroyed.
  absl::MutexLock lock(&mu_);
  contexts_.erase(std::find(contexts_.begin(), contexts_.end(), context));
}

GroupContext::GroupContext(CallGroup& group, absl::Time deadline)
    : group_(group) {
  SetDeadline(&context_, deadline);
  group_.Attach(&context_);
}

GroupContext::~GroupContext() { group_.Detach(&context_); }

void CallGroup::Fail(absl::Status status) {
  absl::MutexLock lock(&mu_);
  if (!first_error_.ok()) return;
  first_error_ = std::move(status);
  for (grpc::ClientContext* context : contexts_) context->TryCancel();
}

absl::Status CallGroup::status() const {
  absl::MutexLock lock(&mu_);
  return first_error_;
}

absl::Status RunOnServers(
    const Connections& connections, const std::vector<uint32_t>& servers,
    const std::function<absl::Status(uint32_t server, CallGroup& group)>&
        task) {
  CallGroup group;
  auto run = [&](uint32_t server) {
    absl::Status status = task(server, group);
    if (!status.ok()) {
      group.Fail(WithServer(status, connections[server]->address));
    }
  };
  if (servers.size() == 1) {
    run(servers.front());
    return group.status();
  }
  std::vector<std::thread> threads;
  threads.reserve(servers.size());
  for (uint32_t server : servers) threads.emplace_back(run, server);
  for (std::thread& thread : threads) thread.join();
  return group.status();
}

std::vector<uint32_t> AllServers(size_t n) {
  std::vector<uint32_t> servers(n);
  std::iota(servers.begin(), servers.end(), uint32_t{0});
  return servers;
}

}  // namespace depot::client_internal
