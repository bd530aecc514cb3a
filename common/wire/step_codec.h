// The Step RPC's chunk messages (StepRequest.chunk and StepResponse.chunk, a
// Chunk{index, payload}) encoded and parsed by hand, so that a chunk's payload
// never goes through a protobuf `bytes`: a sender puts the few bytes that come
// before the payload (EncodeChunkPrefix) in front of a slice that references
// the payload where it already lies, and a receiver finds the payload in the
// message's received pieces (ParseChunkMessage) and copies it once, straight
// to where it belongs (CopyMessageBytes).
//
// The bytes are exactly protobuf's encoding of the same message, so peers that
// use the generated code interoperate. The parser accepts every encoding
// protobuf accepts for a message that holds only chunks: fields in any order,
// unknown fields of every wire type skipped, overlong varints, repeated
// occurrences merged as protobuf merges them (the last index and the last
// payload win). It knows nothing of the oneof's other members: a message that
// carries one of them is left to protobuf (kOther).
//
// Nothing here depends on gRPC; byte_buffers.h moves these messages in and out
// of grpc::ByteBuffer.
#ifndef DEPOT_COMMON_WIRE_STEP_CODEC_H_
#define DEPOT_COMMON_WIRE_STEP_CODEC_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace depot::wire {

// The two messages of the Step RPC whose oneof holds a `Chunk chunk`
// (proto/depot/v1/depot.proto).
enum class StepMessage { kRequest, kResponse };

// Three tags and three varints at most.
inline constexpr size_t kMaxChunkPrefixBytes = 3 * (1 + 10);

// The bytes of a serialized message that come before a chunk's payload.
struct ChunkPrefix {
  size_t size = 0;
  char bytes[kMaxChunkPrefixBytes];

  absl::string_view view() const { return absl::string_view(bytes, size); }
};

// The prefix of a `message` whose oneof holds chunk{index, payload} with a
// payload of `payload_bytes` bytes: prefix + payload is byte for byte what
// protobuf's serializer writes (which leaves out a zero index and an empty
// payload).
ChunkPrefix EncodeChunkPrefix(StepMessage message, uint64_t index,
                              uint64_t payload_bytes);

// A serialized message, as the pieces it arrived in (a grpc::ByteBuffer's
// slices), in order.
using MessagePieces = absl::Span<const absl::string_view>;

// Where a chunk's fields lie in its message.
struct ChunkFields {
  uint64_t index = 0;
  uint64_t payload_offset = 0;  // from the message's first byte
  uint64_t payload_size = 0;
};

enum class MessageKind {
  kChunk,  // the message parses to a oneof holding a chunk: see ChunkFields
  kOther,  // anything else: parse it with protobuf
};

// Reads a serialized `message`. kChunk, with *chunk filled, when
// the only members of the oneof in the message are chunks. kOther when it
// carries another member of the oneof (as a length-delimited field), or none:
// then protobuf's parser decides what it is (it may still end as a chunk, when
// a chunk comes after another member). INVALID_ARGUMENT, saying what is wrong
// and at which byte, when the bytes are not a valid protobuf encoding: a
// truncated field, a varint over 10 bytes, a tag or length over its limits,
// field number 0, wire type 6 or 7, an unmatched end-group.
absl::StatusOr<MessageKind> ParseChunkMessage(MessagePieces pieces,
                                              StepMessage message,
                                              ChunkFields* chunk);

// Copies bytes [offset, offset + size) of the message to `out`.
// REQUIRES: offset + size <= the message's size.
void CopyMessageBytes(MessagePieces pieces, uint64_t offset, uint64_t size,
                      void* out);

}  // namespace depot::wire

#endif  // DEPOT_COMMON_WIRE_STEP_CODEC_H_
