#include "server/blocking_call.h"

#include <utility>

#include "wire/wire.h"

namespace depot {

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*
BlockingCall::Start(HandlerThreads& threads, Handler handler,
                    absl::FunctionRef<void(const absl::Status&)> refused) {
  auto* call = new BlockingCall(std::move(handler));
  // The reactor lives until OnDone, which cannot come before Finish: the
  // handler's thread may use it until then, and Finish is its last act.
  if (!threads.Run([call] { call->Finish(call->handler_(*call)); })) {
    // Retryable: the calls that hold the threads end, or time out.
    const absl::Status status = absl::ResourceExhaustedError(
        "depot-server has no thread left for this call (every handler "
        "thread serves another call): retry later");
    refused(status);
    call->Finish(ToGrpcStatus(status));
  }
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
