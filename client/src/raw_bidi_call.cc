#include "raw_bidi_call.h"

namespace depot::client_internal {

RawBidiCall::RawBidiCall(grpc::GenericStub& stub, const std::string& method,
                         grpc::ClientContext* context) {
  stub.PrepareBidiStreamingCall(context, method, grpc::StubOptions(), this);
  // Operations start from the caller's threads, not from reactions: without
  // a hold the call could end (OnDone) before the next one starts.
  AddHold();
  StartCall();
}

RawBidiCall::~RawBidiCall() { Finish(); }

bool RawBidiCall::Write(const grpc::ByteBuffer& message) {
  write_.Arm();
  StartWrite(&message);
  return write_.Wait();
}

bool RawBidiCall::WritesDone() {
  write_.Arm();
  StartWritesDone();
  return write_.Wait();
}

bool RawBidiCall::Read(grpc::ByteBuffer* message) {
  read_.Arm();
  StartRead(message);
  return read_.Wait();
}

grpc::Status RawBidiCall::Finish() {
  bool release = false;
  {
    absl::MutexLock lock(&mu_);
    release = held_;
    held_ = false;
  }
  if (release) RemoveHold();
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&done_));
  return status_;
}

void RawBidiCall::OnWriteDone(bool ok) { write_.Done(ok); }

void RawBidiCall::OnWritesDoneDone(bool ok) { write_.Done(ok); }

void RawBidiCall::OnReadDone(bool ok) { read_.Done(ok); }

void RawBidiCall::OnDone(const grpc::Status& status) {
  absl::MutexLock lock(&mu_);
  status_ = status;
  done_ = true;
}

}  // namespace depot::client_internal
