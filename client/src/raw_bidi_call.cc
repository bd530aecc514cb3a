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
  {
    absl::MutexLock lock(&mu_);
    write_done_ = false;
  }
  StartWrite(&message);
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&write_done_));
  return write_ok_;
}

bool RawBidiCall::WritesDone() {
  {
    absl::MutexLock lock(&mu_);
    write_done_ = false;
  }
  StartWritesDone();
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&write_done_));
  return write_ok_;
}

bool RawBidiCall::Read(grpc::ByteBuffer* message) {
  {
    absl::MutexLock lock(&mu_);
    read_done_ = false;
  }
  StartRead(message);
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&read_done_));
  return read_ok_;
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

void RawBidiCall::OnWriteDone(bool ok) {
  absl::MutexLock lock(&mu_);
  write_ok_ = ok;
  write_done_ = true;
}

void RawBidiCall::OnWritesDoneDone(bool ok) {
  absl::MutexLock lock(&mu_);
  write_ok_ = ok;
  write_done_ = true;
}

void RawBidiCall::OnReadDone(bool ok) {
  absl::MutexLock lock(&mu_);
  read_ok_ = ok;
  read_done_ = true;
}

void RawBidiCall::OnDone(const grpc::Status& status) {
  absl::MutexLock lock(&mu_);
  status_ = status;
  done_ = true;
}

}  // namespace depot::client_internal
