// Reaction: the outcome of one operation of a gRPC callback reactor, for code
// that starts the operation from its own thread and blocks until it ends (the
// client's RawBidiCall, the server's BlockingCall):
//
//   read_.Arm();                 // before the operation starts
//   StartRead(&message);
//   return read_.Wait();         // the reaction's `ok`
//
//   void OnReadDone(bool ok) override { read_.Done(ok); }
//
// Thread safety: Done may run on any thread, before Wait or during it. One
// operation at a time: Arm again only after Wait returned.
#ifndef DEPOT_COMMON_WIRE_REACTION_H_
#define DEPOT_COMMON_WIRE_REACTION_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace depot {

class Reaction {
 public:
  // Forgets the last operation's outcome.
  void Arm() {
    absl::MutexLock lock(&mu_);
    done_ = false;
  }
  // The operation's reaction came with `ok`.
  void Done(bool ok) {
    absl::MutexLock lock(&mu_);
    ok_ = ok;
    done_ = true;
  }
  // Waits for the reaction, and returns its `ok`.
  bool Wait() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&done_));
    return ok_;
  }

 private:
  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  bool ok_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace depot

#endif  // DEPOT_COMMON_WIRE_REACTION_H_
