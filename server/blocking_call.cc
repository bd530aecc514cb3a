#include "server/blocking_call.h"

#include <utility>

namespace depot {

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*
BlockingCall::Start(HandlerThreads& threads, Handler handler) {
  auto* call = new BlockingCall(std::move(handler));
  // The reactor lives until OnDone, which cannot come before Finish: the
  // handler's thread may use it until then, and Finish is its last act.
  threads.Run([call] { call->Finish(call->handler_(*call)); });
  return call;
}

bool BlockingCall::Read(grpc::ByteBuffer* message) {
  {
    absl::MutexLock lock(&mu_);
    if (reads_over_) return false;
    read_done_ = false;
  }
  StartRead(message);
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&read_done_));
  if (!read_ok_) reads_over_ = true;
  return read_ok_;
}

bool BlockingCall::Write(const grpc::ByteBuffer& message) {
  {
    absl::MutexLock lock(&mu_);
    write_done_ = false;
  }
  StartWrite(&message);
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&write_done_));
  return write_ok_;
}

void BlockingCall::OnReadDone(bool ok) {
  absl::MutexLock lock(&mu_);
  read_ok_ = ok;
  read_done_ = true;
}

void BlockingCall::OnWriteDone(bool ok) {
  absl::MutexLock lock(&mu_);
  write_ok_ = ok;
  write_done_ = true;
}

}  // namespace depot
