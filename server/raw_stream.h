// The messages of DepotService's methods other than Step, read and written as
// raw grpc::ByteBuffers and parsed by the service itself: to gRPC each such
// method is a generic bidi stream (server/depot_service.h), whose handler
// reads and writes through a RawStream (server/blocking_call.h).
//
// gRPC's own parsing of a sync method's messages answers a request that is
// not a valid protobuf encoding with INTERNAL and an empty message before the
// handler runs, and in the middle of a client stream it ends the stream as if
// the client had half-closed (an InitWeights chunk dropped, the RPC OK). Read
// here, such a message is INVALID_ARGUMENT naming the RPC, and a stream
// stops at it with that status.
#ifndef DEPOT_SERVER_RAW_STREAM_H_
#define DEPOT_SERVER_RAW_STREAM_H_

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/message_lite.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "grpcpp/support/proto_buffer_writer.h"

namespace depot {

// One call's stream of ByteBuffers in both directions, with blocking
// operations (unary and server-streaming methods read one message from it).
class RawStream {
 public:
  virtual ~RawStream() = default;
  // The next message: true, or false at the end of the stream (the client
  // half-closed) or once the call is over; no message after a false.
  virtual bool Read(grpc::ByteBuffer* message) = 0;
  // Sends `message`: true once gRPC has sent it, false once the client is
  // gone.
  virtual bool Write(const grpc::ByteBuffer& message) = 0;
};

// Parses `buffer` as `message`. INVALID_ARGUMENT naming `what` when it is not
// a valid encoding.
inline absl::Status ParseRawMessage(grpc::ByteBuffer* buffer,
                                    const std::string& what,
                                    google::protobuf::MessageLite* message) {
  grpc::ProtoBufferReader reader(buffer);
  if (!reader.status().ok() || !message->ParseFromZeroCopyStream(&reader)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "malformed ", what, ": not a valid protobuf encoding of a ",
        message->GetTypeName(), " (", buffer->Length(), " bytes)"));
  }
  return absl::OkStatus();
}

// The messages of a client stream, parsed one by one.
template <typename Message>
class RequestReader {
 public:
  // `what` names the messages in errors ("InitWeights request").
  RequestReader(RawStream* stream, std::string what)
      : stream_(stream), what_(std::move(what)) {}

  // The next message into *message: true, or false at the end of the stream
  // and at a message that does not parse, which status() then says (the
  // stream must fail with it; nothing after it is read).
  bool Read(Message* message) {
    if (!status_.ok()) return false;
    grpc::ByteBuffer buffer;
    if (!stream_->Read(&buffer)) return false;
    message->Clear();
    status_ = ParseRawMessage(&buffer, what_, message);
    return status_.ok();
  }

  const absl::Status& status() const { return status_; }

 private:
  RawStream* const stream_;
  const std::string what_;
  absl::Status status_;
};

// The messages of a server stream.
template <typename Message>
class ResponseWriter {
 public:
  explicit ResponseWriter(RawStream* stream) : stream_(stream) {}

  // False once the client is gone (as grpc::ServerWriter::Write).
  bool Write(const Message& message) {
    // Serialized straight into the buffer's slices (messages stay under
    // the server's 64 MiB limit, so the size fits an int).
    grpc::ByteBuffer buffer;
    {
      grpc::ProtoBufferWriter writer(&buffer,
                                     grpc::kProtoBufferWriterMaxBufferLength,
                                     static_cast<int>(message.ByteSizeLong()));
      if (!message.SerializeToZeroCopyStream(&writer)) return false;
    }
    return stream_->Write(buffer);
  }

 private:
  RawStream* const stream_;
};

}  // namespace depot

#endif  // DEPOT_SERVER_RAW_STREAM_H_
