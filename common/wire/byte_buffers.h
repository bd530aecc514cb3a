// The Step RPC's messages in and out of grpc::ByteBuffer: chunk messages as a
// hand-encoded prefix and a slice that references the payload (no copy; see
// step_codec.h), everything else (headers, commits, stats, acks) through
// protobuf, as they are small.
#ifndef DEPOT_COMMON_WIRE_BYTE_BUFFERS_H_
#define DEPOT_COMMON_WIRE_BYTE_BUFFERS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message_lite.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "wire/step_codec.h"

namespace depot::wire {

// A chunk `message` of chunk `index` whose payload is the `payload_bytes`
// bytes at `payload`, referenced, not copied: they must stay valid and
// unchanged until gRPC calls release(user_data), once, when it no longer
// needs them (at once for an empty payload). gRPC may call it on any thread.
grpc::ByteBuffer ChunkMessageBuffer(StepMessage message, uint64_t index,
                                    const void* payload, size_t payload_bytes,
                                    void (*release)(void*), void* user_data);

// `message` serialized by protobuf into `buffer` (one slice).
void SerializeToBuffer(const google::protobuf::MessageLite& message,
                       grpc::ByteBuffer* buffer);

// Parses `pieces` as `message` with protobuf. INVALID_ARGUMENT naming
// `what` when they are not a valid encoding.
absl::Status ParseFromPieces(MessagePieces pieces, absl::string_view what,
                             google::protobuf::MessageLite* message);

// A received message's slices, held (references, no copy) so that views of
// their bytes stay valid. Reused from message to message, so that a stream's
// steady state allocates nothing.
class ReceivedMessage {
 public:
  // Takes references to `buffer`'s slices, dropping the previous message's.
  // INTERNAL when the buffer cannot be read (it holds no message).
  absl::Status Load(const grpc::ByteBuffer& buffer);

  MessagePieces pieces() const { return pieces_; }

  // Drops the references.
  void Clear();

 private:
  std::vector<grpc::Slice> slices_;
  std::vector<absl::string_view> pieces_;
};

}  // namespace depot::wire

#endif  // DEPOT_COMMON_WIRE_BYTE_BUFFERS_H_
