#include "wire/byte_buffers.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace depot::wire {

grpc::ByteBuffer ChunkMessageBuffer(StepMessage message, uint64_t index,
                                    const void* payload, size_t payload_bytes,
                                    void (*release)(void*), void* user_data) {
  const ChunkPrefix prefix = EncodeChunkPrefix(message, index, payload_bytes);
  // The prefix is copied: a few bytes, inlined in the slice itself.
  grpc::Slice slices[2] = {grpc::Slice(prefix.bytes, prefix.size),
                           grpc::Slice()};
  if (payload_bytes == 0) {
    release(user_data);
    return grpc::ByteBuffer(slices, 1);
  }
  // gRPC never writes through a slice it sends; the cast only fits the
  // constructor's signature.
  slices[1] = grpc::Slice(const_cast<void*>(payload), payload_bytes, release,
                          user_data);
  return grpc::ByteBuffer(slices, 2);
}

void SerializeToBuffer(const google::protobuf::MessageLite& message,
                       grpc::ByteBuffer* buffer) {
  const size_t size = message.ByteSizeLong();
  grpc::Slice slice(size);
  message.SerializeWithCachedSizesToArray(const_cast<uint8_t*>(slice.begin()));
  *buffer = grpc::ByteBuffer(&slice, 1);
}

absl::Status ParseFromPieces(MessagePieces pieces, absl::string_view what,
                             google::protobuf::MessageLite* message) {
  bool parsed = false;
  if (pieces.size() == 1) {
    parsed = message->ParseFromArray(pieces[0].data(),
                                     static_cast<int>(pieces[0].size()));
  } else {
    std::string bytes;
    for (absl::string_view piece : pieces) {
      bytes.append(piece.data(), piece.size());
    }
    parsed = message->ParseFromString(bytes);
  }
  if (!parsed) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed ", what, ": not a valid protobuf encoding"));
  }
  return absl::OkStatus();
}

absl::Status ReceivedMessage::Load(const grpc::ByteBuffer& buffer) {
  pieces_.clear();
  const grpc::Status dumped = buffer.Dump(&slices_);
  if (!dumped.ok()) {
    slices_.clear();
    return absl::InternalError(absl::StrCat("cannot read a received message: ",
                                            dumped.error_message()));
  }
  for (const grpc::Slice& slice : slices_) {
    pieces_.emplace_back(reinterpret_cast<const char*>(slice.begin()),
                         slice.size());
  }
  return absl::OkStatus();
}

void ReceivedMessage::Clear() {
  slices_.clear();
  pieces_.clear();
}

}  // namespace depot::wire
