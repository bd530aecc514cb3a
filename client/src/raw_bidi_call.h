// RawBidiCall: one client bidi-streaming call of raw messages
// (grpc::ByteBuffer both ways, so that chunk payloads are never copied
// through protobuf), with the blocking Write, WritesDone, Read and Finish of
// grpc::ClientReaderWriter, over gRPC's public callback API
// (grpc::GenericStub::PrepareBidiStreamingCall) instead of its internal
// classes: each call starts one operation and waits for its reaction.
//
// Thread safety: one thread may write (Write, WritesDone) while another reads
// (Read); Finish once neither will call again. The destructor waits for the
// call to end (Finish, if it was not called).
#ifndef DEPOT_CLIENT_SRC_RAW_BIDI_CALL_H_
#define DEPOT_CLIENT_SRC_RAW_BIDI_CALL_H_

#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/client_context.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/client_callback.h"
#include "grpcpp/support/status.h"
#include "wire/reaction.h"

namespace depot::client_internal {

class RawBidiCall final
    : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  // Starts the call of `method` ("/package.Service/Method") on `stub`'s
  // channel. `stub` and `context` must outlive the call.
  RawBidiCall(grpc::GenericStub& stub, const std::string& method,
              grpc::ClientContext* context);
  ~RawBidiCall() override;

  RawBidiCall(const RawBidiCall&) = delete;
  RawBidiCall& operator=(const RawBidiCall&) = delete;

  // Sends `message` (its slices are shared, not copied) and waits until
  // gRPC has taken it. False once the stream is broken: Finish says why.
  bool Write(const grpc::ByteBuffer& message);
  // Half-closes the stream. False once it is broken.
  bool WritesDone();
  // Waits for the next message. False at the end of the stream or once it
  // is broken; no Read after that.
  bool Read(grpc::ByteBuffer* message);
  // Waits for the call to end and returns its status.
  grpc::Status Finish();

 private:
  void OnWriteDone(bool ok) override;
  void OnWritesDoneDone(bool ok) override;
  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

  // The reactions of the write (or half-close) and of the read in flight.
  Reaction write_;
  Reaction read_;
  absl::Mutex mu_;
  // The hold that lets this class start operations from the caller's
  // threads (outside reactions) until Finish lets go of it.
  bool held_ ABSL_GUARDED_BY(mu_) = true;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace depot::client_internal

#endif  // DEPOT_CLIENT_SRC_RAW_BIDI_CALL_H_
