// CallGroup: the RPCs of one client operation (a Step, an InitWeights, ...)
// that run on several servers at once. The first failure wins and cancels the
// others, so a worker whose peer server died does not wait for its healthy
// streams' deadlines.
#ifndef DEPOT_CLIENT_SRC_CALL_GROUP_H_
#define DEPOT_CLIENT_SRC_CALL_GROUP_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "channel.h"
#include "grpcpp/client_context.h"

namespace depot::client_internal {

class CallGroup {
 public:
  // Records `status` (not OK) if it is the group's first failure, then cancels
  // every member context. Later failures are consequences and are dropped.
  void Fail(absl::Status status);

  // OK, or the first failure.
  absl::Status status() const;

 private:
  friend class GroupContext;
  void Attach(grpc::ClientContext* context);
  void Detach(grpc::ClientContext* context);

  mutable absl::Mutex mu_;
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);
  std::vector<grpc::ClientContext*> contexts_ ABSL_GUARDED_BY(mu_);
};

// The ClientContext of one RPC of a group: it has the operation's deadline and
// is cancelled when the group fails. If the group has already failed, it starts
// out cancelled (its RPC then ends CANCELLED, which the group ignores: it
// already holds the first error).
class GroupContext {
 public:
  GroupContext(CallGroup& group, absl::Time deadline);
  ~GroupContext();
  GroupContext(const GroupContext&) = delete;
  GroupContext& operator=(const GroupContext&) = delete;

  grpc::ClientContext* get() { return &context_; }

 private:
  CallGroup& group_;
  grpc::ClientContext context_;
};

// Runs task(s, group) for every server index s in `servers`, each on its own
// thread (inline when there is one), and waits for all. A task's error is
// prefixed with connections[s]'s address and fails the group. Returns the
// group's status.
absl::Status RunOnServers(
    const Connections& connections, const std::vector<uint32_t>& servers,
    const std::function<absl::Status(uint32_t server, CallGroup& group)>& task);

// 0, 1, ..., n - 1: every server.
std::vector<uint32_t> AllServers(size_t n);

}  // namespace depot::client_internal

#endif  // DEPOT_CLIENT_SRC_CALL_GROUP_H_
