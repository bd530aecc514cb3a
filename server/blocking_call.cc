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
  if (reads_over_) return false;
  read_.Arm();
  StartRead(message);
  reads_over_ = !read_.Wait();
  return !reads_over_;
}

bool BlockingCall::Write(const grpc::ByteBuffer& message) {
  write_.Arm();
  StartWrite(&message);
  return write_.Wait();
}

}  // namespace depot
