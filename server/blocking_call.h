// BlockingCall: one call of a Depot method other than Step, served by a
// blocking handler. To gRPC it is a reactor of its public callback API (every
// such method reaches DepotService as a generic bidi stream of ByteBuffers,
// server/depot_service.h); to the handler it is a RawStream whose Read and
// Write wait for their operation. The handler runs on a HandlerThreads thread,
// never on gRPC's callback threads, which must not block: CreateJob may
// allocate and touch gigabytes, ImportCheckpoint reads files, a pull waits for
// its client to read.
//
// Lifetime: Start runs the handler; once it returns the call finishes with
// its status, and the reactor deletes itself when gRPC is done with it. A
// cancelled call (the client went away, the server shuts down) makes the
// pending and later Read and Write return false, so the handler ends.
#ifndef DEPOT_SERVER_BLOCKING_CALL_H_
#define DEPOT_SERVER_BLOCKING_CALL_H_

#include <functional>
#include <utility>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/server_callback.h"
#include "grpcpp/support/status.h"
#include "server/handler_threads.h"
#include "server/raw_stream.h"
#include "wire/reaction.h"

namespace depot {

class BlockingCall final
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>,
      public RawStream {
 public:
  using Handler = std::function<grpc::Status(RawStream&)>;

  // A reactor whose call runs `handler` on one of `threads`, which must
  // outlive the call. Return it to gRPC (CallbackGenericService::
  // CreateReactor). When `threads` has none to give, the call ends at once
  // with RESOURCE_EXHAUSTED, which `refused` is told (to count and log it),
  // and the handler never runs.
  static grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Start(
      HandlerThreads& threads, Handler handler,
      absl::FunctionRef<void(const absl::Status&)> refused);

  BlockingCall(const BlockingCall&) = delete;
  BlockingCall& operator=(const BlockingCall&) = delete;

  bool Read(grpc::ByteBuffer* message) override;
  // Waits until gRPC has sent `message` (its slices are shared, not copied).
  bool Write(const grpc::ByteBuffer& message) override;

 private:
  explicit BlockingCall(Handler handler) : handler_(std::move(handler)) {}
  ~BlockingCall() override = default;

  void OnReadDone(bool ok) override { read_.Done(ok); }
  void OnWriteDone(bool ok) override { write_.Done(ok); }
  void OnDone() override { delete this; }

  const Handler handler_;
  // The reactions of the read and of the write in flight.
  Reaction read_;
  Reaction write_;
  // A read failed: the client half-closed or the call is over; no read
  // after it. Only the handler's thread reads and writes it.
  bool reads_over_ = false;
};

}  // namespace depot

#endif  // DEPOT_SERVER_BLOCKING_CALL_H_
