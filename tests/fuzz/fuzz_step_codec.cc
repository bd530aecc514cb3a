// Fuzz target: the Step RPC's hand-written chunk codec (common/wire/
// step_codec.h), checked against protobuf's generated parser, which it
// promises to agree with.
//
// Input: byte 0 picks the message (bit 0: StepRequest or StepResponse) and
// how many pieces the bytes arrive in (bits 1-3); the next bytes are the
// piece boundaries; the rest is the serialized message. Invariants:
//   - kChunk: protobuf parses the same bytes, its oneof holds a chunk with
//     the same index, and the payload CopyMessageBytes copies is protobuf's;
//   - an error is INVALID_ARGUMENT, and protobuf refuses the bytes too;
//   - ParseFromPieces (what the server uses for the other messages) agrees
//     with protobuf's ParseFromString whatever the pieces;
//   - EncodeChunkPrefix + payload, for an index and payload taken from the
//     input, is protobuf's serialization byte for byte and parses back.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "depot/v1/depot.pb.h"
#include "tests/fuzz/fuzz_support.h"
#include "wire/byte_buffers.h"
#include "wire/step_codec.h"

namespace {

using depot::wire::ChunkFields;
using depot::wire::MessageKind;
using depot::wire::StepMessage;

// The chunk protobuf sees in `bytes`, when its oneof holds one.
bool ProtobufChunk(StepMessage kind, const std::string& bytes, bool* parsed,
                   depot::v1::Chunk* chunk) {
  if (kind == StepMessage::kRequest) {
    depot::v1::StepRequest request;
    *parsed = request.ParseFromString(bytes);
    if (!*parsed || !request.has_chunk()) return false;
    *chunk = request.chunk();
    return true;
  }
  depot::v1::StepResponse response;
  *parsed = response.ParseFromString(bytes);
  if (!*parsed || !response.has_chunk()) return false;
  *chunk = response.chunk();
  return true;
}

void CheckParse(StepMessage kind, const std::string& bytes,
                const std::vector<absl::string_view>& pieces) {
  ChunkFields fields;
  absl::StatusOr<MessageKind> got =
      depot::wire::ParseChunkMessage(pieces, kind, &fields);
  bool parsed = false;
  depot::v1::Chunk chunk;
  const bool protobuf_chunk = ProtobufChunk(kind, bytes, &parsed, &chunk);
  if (!got.ok()) {
    DEPOT_FUZZ_CHECK(got.status().code() == absl::StatusCode::kInvalidArgument,
                     "error %s", got.status().ToString().c_str());
    DEPOT_FUZZ_CHECK(!parsed, "the codec refuses what protobuf parses: %s",
                     got.status().ToString().c_str());
    return;
  }
  if (*got == MessageKind::kChunk) {
    DEPOT_FUZZ_CHECK(parsed && protobuf_chunk,
                     "the codec found a chunk, protobuf %s",
                     parsed ? "a message without one" : "refuses the bytes");
    DEPOT_FUZZ_CHECK(fields.index == chunk.index(), "index %llu, protobuf %llu",
                     static_cast<unsigned long long>(fields.index),
                     static_cast<unsigned long long>(chunk.index()));
    DEPOT_FUZZ_CHECK(
        fields.payload_offset <= bytes.size() &&
            fields.payload_size <= bytes.size() - fields.payload_offset,
        "payload [%llu, +%llu) outside a message of %zu bytes",
        static_cast<unsigned long long>(fields.payload_offset),
        static_cast<unsigned long long>(fields.payload_size), bytes.size());
    std::string payload(fields.payload_size, '\0');
    depot::wire::CopyMessageBytes(pieces, fields.payload_offset,
                                  fields.payload_size, payload.data());
    DEPOT_FUZZ_CHECK(payload == chunk.payload(),
                     "payload of %zu bytes differs from protobuf's (%zu)",
                     payload.size(), chunk.payload().size());
  }
  // What the reactor does with a kOther message.
  depot::v1::StepRequest request;
  const absl::Status s =
      depot::wire::ParseFromPieces(pieces, "Step request", &request);
  depot::v1::StepRequest reference;
  DEPOT_FUZZ_CHECK(s.ok() == reference.ParseFromString(bytes),
                   "ParseFromPieces says %s", s.ToString().c_str());
}

void CheckEncode(StepMessage kind, uint64_t index, const std::string& payload) {
  const depot::wire::ChunkPrefix prefix =
      depot::wire::EncodeChunkPrefix(kind, index, payload.size());
  const std::string bytes = std::string(prefix.view()) + payload;
  std::string expected;
  if (kind == StepMessage::kRequest) {
    depot::v1::StepRequest request;
    request.mutable_chunk()->set_index(index);
    request.mutable_chunk()->set_payload(payload);
    expected = request.SerializeAsString();
  } else {
    depot::v1::StepResponse response;
    response.mutable_chunk()->set_index(index);
    response.mutable_chunk()->set_payload(payload);
    expected = response.SerializeAsString();
  }
  DEPOT_FUZZ_CHECK(bytes == expected,
                   "EncodeChunkPrefix(index %llu, %zu bytes) differs from "
                   "protobuf's serialization",
                   static_cast<unsigned long long>(index), payload.size());
  // The prefix and the payload as two pieces, as the sender sends them.
  std::vector<absl::string_view> pieces = {prefix.view(), payload};
  ChunkFields fields;
  absl::StatusOr<MessageKind> got =
      depot::wire::ParseChunkMessage(pieces, kind, &fields);
  DEPOT_FUZZ_CHECK(
      got.ok() && *got == MessageKind::kChunk && fields.index == index &&
          fields.payload_size == payload.size() &&
          (payload.empty() || fields.payload_offset == prefix.size),
      "chunk (index %llu, %zu bytes) does not parse back",
      static_cast<unsigned long long>(index), payload.size());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  depot::fuzz::InputReader in(data, size);
  const uint8_t mode = in.U8();
  const StepMessage kind =
      (mode & 1) != 0 ? StepMessage::kResponse : StepMessage::kRequest;
  const int cuts = (mode >> 1) & 7;
  std::vector<size_t> at;
  for (int i = 0; i < cuts; ++i) at.push_back(in.U8());
  const std::string bytes = in.Rest();
  for (size_t& a : at) a = bytes.empty() ? 0 : a % (bytes.size() + 1);
  std::sort(at.begin(), at.end());
  std::vector<absl::string_view> pieces;
  size_t from = 0;
  for (size_t a : at) {  // equal cuts give empty pieces, which must work too
    pieces.emplace_back(bytes.data() + from, a - from);
    from = a;
  }
  pieces.emplace_back(bytes.data() + from, bytes.size() - from);
  CheckParse(kind, bytes, pieces);

  // The encoder, with the first 8 bytes as the index and the rest as payload.
  uint64_t index = 0;
  for (size_t i = 0; i < 8 && i < bytes.size(); ++i) {
    index |= uint64_t{static_cast<uint8_t>(bytes[i])} << (8 * i);
  }
  CheckEncode(kind, index, bytes.size() > 8 ? bytes.substr(8) : std::string());
  return 0;
}

std::vector<std::string> DepotFuzzSeeds() {
  std::vector<std::string> seeds;
  depot::v1::StepRequest chunk;
  chunk.mutable_chunk()->set_index(7);
  chunk.mutable_chunk()->set_payload(std::string(40, '\x3f'));
  seeds.push_back(std::string("\x04\x03\x09", 3) + chunk.SerializeAsString());
  depot::v1::StepRequest header;
  header.mutable_header()->set_job_id(1);
  header.mutable_header()->set_fingerprint(0x1234567890abcdefULL);
  header.mutable_header()->set_step(3);
  header.mutable_header()->add_group_hparams()->set_lr(0.5);
  seeds.push_back(std::string("\x00", 1) + header.SerializeAsString());
  depot::v1::StepResponse response;
  response.mutable_chunk()->set_index(300);
  response.mutable_chunk()->set_payload("weights!");
  seeds.push_back(std::string("\x03\x05", 2) + response.SerializeAsString());
  depot::v1::StepResponse stats;
  stats.mutable_stats()->set_step(9);
  stats.mutable_stats()->set_chunks(2);
  seeds.push_back(std::string("\x01", 1) + stats.SerializeAsString());
  // A chunk with an unknown group field and an overlong varint index.
  seeds.push_back(std::string(
      "\x00\x12\x0e\x08\x81\x80\x80\x80\x00\x1b\x08\x01\x1c\x12\x02hi", 17));
  return seeds;
}
