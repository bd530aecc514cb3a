// The hand-written chunk codec against protobuf's own serializer and parser:
// the same bytes out, the same reading of every encoding in, the same
// refusals of malformed input.
#include "wire/step_codec.h"

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/string_view.h"
#include "depot/v1/depot.pb.h"
#include "gtest/gtest.h"
#include "tests/integration/protobuf_bytes.h"

namespace depot::wire {
namespace {

using ::depot::testing::LengthDelimited;
using ::depot::testing::Tag;
using ::depot::testing::Varint;

std::string Payload(size_t size) {
  std::string payload(size, '\0');
  for (size_t i = 0; i < size; ++i) payload[i] = static_cast<char>(i * 7 + 3);
  return payload;
}

// `bytes` cut into pieces of `piece` bytes (the last may be shorter), with an
// empty piece between every two: pieces must not matter.
struct Pieces {
  Pieces(const std::string& bytes, size_t piece) {
    for (size_t at = 0; at < bytes.size(); at += piece) {
      views.push_back(absl::string_view(bytes).substr(at, piece));
      views.push_back(absl::string_view());
    }
  }
  std::vector<absl::string_view> views;
};

// What the codec makes of `bytes`, read in pieces of every size from 1 up.
absl::StatusOr<MessageKind> ParseInPieces(const std::string& bytes,
                                          StepMessage message,
                                          ChunkFields* chunk,
                                          std::string* payload) {
  absl::StatusOr<MessageKind> first;
  for (size_t piece = 1; piece <= bytes.size() + 1; ++piece) {
    const Pieces pieces(bytes, piece);
    ChunkFields fields;
    absl::StatusOr<MessageKind> kind =
        ParseChunkMessage(pieces.views, message, &fields);
    std::string copied;
    if (kind.ok() && *kind == MessageKind::kChunk) {
      copied.resize(fields.payload_size);
      CopyMessageBytes(pieces.views, fields.payload_offset, fields.payload_size,
                       copied.data());
    }
    if (piece == 1) {
      first = kind;
      *chunk = fields;
      *payload = copied;
      continue;
    }
    EXPECT_EQ(kind.ok(), first.ok()) << "pieces of " << piece;
    if (kind.ok() && first.ok()) {
      EXPECT_EQ(*kind, *first);
      EXPECT_EQ(fields.index, chunk->index);
      EXPECT_EQ(copied, *payload);
    }
  }
  return first;
}

// Checks that the codec reads `bytes` as protobuf reads a StepRequest: when
// the codec finds a chunk, protobuf finds the same; when the codec refuses
// the bytes, so does protobuf. Returns the codec's verdict.
absl::StatusOr<MessageKind> ExpectRequestAgreesWithProtobuf(
    const std::string& bytes) {
  ChunkFields chunk;
  std::string payload;
  absl::StatusOr<MessageKind> kind =
      ParseInPieces(bytes, StepMessage::kRequest, &chunk, &payload);
  v1::StepRequest request;
  const bool parsed = request.ParseFromString(bytes);
  if (!kind.ok()) {
    EXPECT_EQ(kind.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_FALSE(parsed) << "protobuf accepts what the codec refuses: "
                         << kind.status();
  } else if (*kind == MessageKind::kChunk) {
    // (kOther: protobuf decides what the message holds, or that it is
    // malformed.)
    EXPECT_TRUE(parsed) << "protobuf refuses what the codec accepts";
    if (parsed) {
      EXPECT_TRUE(request.has_chunk());
      EXPECT_EQ(chunk.index, request.chunk().index());
      EXPECT_EQ(payload, request.chunk().payload());
    }
  }
  return kind;
}

TEST(StepCodecTest, PrefixAndPayloadAreProtobufsOwnBytes) {
  const uint64_t indices[] = {
      0, 1, 127, 128, 16383, 16384, uint64_t{1} << 35, ~uint64_t{0}};
  const size_t sizes[] = {0, 1, 100, 127, 128, 16383, 16384, 2 << 20};
  for (uint64_t index : indices) {
    for (size_t size : sizes) {
      const std::string payload = Payload(size);
      v1::StepRequest request;
      request.mutable_chunk()->set_index(index);
      request.mutable_chunk()->set_payload(payload);
      EXPECT_EQ(
          std::string(
              EncodeChunkPrefix(StepMessage::kRequest, index, size).view()) +
              payload,
          request.SerializeAsString())
          << "index " << index << ", " << size << " bytes";
      v1::StepResponse response;
      response.mutable_chunk()->set_index(index);
      response.mutable_chunk()->set_payload(payload);
      EXPECT_EQ(
          std::string(
              EncodeChunkPrefix(StepMessage::kResponse, index, size).view()) +
              payload,
          response.SerializeAsString());
    }
  }
}

TEST(StepCodecTest, ReadsProtobufsChunksInAnyPieces) {
  for (uint64_t index : {uint64_t{0}, uint64_t{5}, uint64_t{1} << 40}) {
    for (size_t size : {size_t{0}, size_t{3}, size_t{300}}) {
      v1::StepResponse response;
      response.mutable_chunk()->set_index(index);
      response.mutable_chunk()->set_payload(Payload(size));
      ChunkFields chunk;
      std::string payload;
      absl::StatusOr<MessageKind> kind =
          ParseInPieces(response.SerializeAsString(), StepMessage::kResponse,
                        &chunk, &payload);
      ASSERT_TRUE(kind.ok()) << kind.status();
      EXPECT_EQ(*kind, MessageKind::kChunk);
      EXPECT_EQ(chunk.index, index);
      EXPECT_EQ(payload, Payload(size));
    }
  }
}

TEST(StepCodecTest, OtherMembersOfTheOneofAreLeftToProtobuf) {
  v1::StepRequest header;
  header.mutable_header()->set_job_id(3);
  header.mutable_header()->set_step(9);
  v1::StepRequest commit;
  commit.mutable_commit()->set_clip_coef(0.5);
  v1::StepResponse stats;
  stats.mutable_stats()->set_chunks(4);
  v1::StepResponse ack;
  ack.mutable_ack()->set_index(4);
  v1::StepResponse grad_stats;
  grad_stats.mutable_grad_stats()->set_sum_squares(2.0);
  ChunkFields chunk;
  const std::string header_bytes = header.SerializeAsString();
  const std::string commit_bytes = commit.SerializeAsString();
  EXPECT_EQ(*ParseChunkMessage({header_bytes}, StepMessage::kRequest, &chunk),
            MessageKind::kOther);
  EXPECT_EQ(*ParseChunkMessage({commit_bytes}, StepMessage::kRequest, &chunk),
            MessageKind::kOther);
  for (const v1::StepResponse* message : {&stats, &ack, &grad_stats}) {
    const std::string bytes = message->SerializeAsString();
    EXPECT_EQ(*ParseChunkMessage({bytes}, StepMessage::kResponse, &chunk),
              MessageKind::kOther);
  }
  // An empty message holds no member at all.
  EXPECT_EQ(*ParseChunkMessage({}, StepMessage::kRequest, &chunk),
            MessageKind::kOther);
  // A header, then a chunk: protobuf's oneof ends as the chunk.
  const std::string header_then_chunk =
      header_bytes + LengthDelimited(2, Tag(1, 0) + Varint(6));
  EXPECT_EQ(ExpectRequestAgreesWithProtobuf(header_then_chunk).value(),
            MessageKind::kOther);
}

// Every other member of the oneof, after a chunk, is what protobuf's oneof
// ends as: the codec must leave such a message to protobuf. Checked against
// the descriptors, so a member added to the .proto is covered (issue 13: a
// chunk followed by a weights_override was read as a chunk).
TEST(StepCodecTest, EveryOtherOneofMemberAfterAChunkIsLeftToProtobuf) {
  const auto check = [](const google::protobuf::Message& prototype,
                        StepMessage kind) {
    const google::protobuf::OneofDescriptor* oneof =
        prototype.GetDescriptor()->FindOneofByName("kind");
    ASSERT_NE(oneof, nullptr);
    const google::protobuf::FieldDescriptor* chunk_field =
        prototype.GetDescriptor()->FindFieldByName("chunk");
    ASSERT_NE(chunk_field, nullptr);
    for (int i = 0; i < oneof->field_count(); ++i) {
      const google::protobuf::FieldDescriptor* member = oneof->field(i);
      if (member == chunk_field) continue;
      std::unique_ptr<google::protobuf::Message> other(prototype.New());
      // A member left at its defaults still serializes as a (short)
      // length-delimited field.
      other->GetReflection()->MutableMessage(other.get(), member);
      std::unique_ptr<google::protobuf::Message> chunk(prototype.New());
      google::protobuf::Message* c =
          chunk->GetReflection()->MutableMessage(chunk.get(), chunk_field);
      c->GetReflection()->SetUInt64(
          c, c->GetDescriptor()->FindFieldByName("index"), 5);
      const std::string bytes =
          chunk->SerializeAsString() + other->SerializeAsString();
      ChunkFields fields;
      EXPECT_EQ(*ParseChunkMessage({bytes}, kind, &fields), MessageKind::kOther)
          << prototype.GetDescriptor()->name() << "." << member->name();
    }
  };
  check(v1::StepRequest::default_instance(), StepMessage::kRequest);
  check(v1::StepResponse::default_instance(), StepMessage::kResponse);
}

TEST(StepCodecTest, ReadsOddEncodingsAsProtobufDoes) {
  const std::string payload = Payload(40);
  const std::string index = Tag(1, 0) + Varint(77);
  const std::string body = LengthDelimited(2, payload);
  const std::vector<std::string> chunks = {
      // Payload before index.
      body + index,
      // Unknown fields of every wire type, in the chunk.
      Tag(9, 0) + Varint(1) + index + Tag(10, 1) + std::string(8, 'x') +
          LengthDelimited(11, "unknown") + Tag(12, 5) + std::string(4, 'y') +
          Tag(13, 3) + Tag(14, 0) + Varint(5) + Tag(13, 4) + body,
      // Known field numbers with other wire types are unknown fields.
      LengthDelimited(1, "not a varint") + Tag(2, 0) + Varint(9) + index + body,
      // An index varint padded to 10 bytes, and one whose tenth byte carries
      // bits beyond 64 (dropped).
      Tag(1, 0) + std::string("\xcd\x80\x80\x80\x80\x80\x80\x80\x80\x00", 10) +
          body,
      Tag(1, 0) + std::string("\xcd\x80\x80\x80\x80\x80\x80\x80\x80\x7f", 10) +
          body,
      // A payload length padded to 5 bytes.
      index + Tag(2, 2) + std::string("\xa8\x80\x80\x80\x00", 5) + payload,
      // Repeated scalars: the last wins.
      Tag(1, 0) + Varint(1) + LengthDelimited(2, "first") + index + body,
      // Tags padded to 5 bytes.
      std::string("\x88\x80\x80\x80\x00", 5) + Varint(77) + body,
  };
  for (const std::string& chunk : chunks) {
    // As the only field, and with unknown fields around it at the top level.
    for (const std::string& message :
         {LengthDelimited(2, chunk),
          Tag(7, 0) + Varint(300) + LengthDelimited(2, chunk) +
              LengthDelimited(20, "tail") + Tag(21, 3) + Tag(21, 4)}) {
      absl::StatusOr<MessageKind> kind =
          ExpectRequestAgreesWithProtobuf(message);
      ASSERT_TRUE(kind.ok()) << kind.status();
      EXPECT_EQ(*kind, MessageKind::kChunk);
    }
  }
}

TEST(StepCodecTest, MergesRepeatedChunkFieldsAsProtobufDoes) {
  // The index from the first occurrence, the payload from the second; then
  // a third that sets the index again.
  const std::string first = LengthDelimited(2, Tag(1, 0) + Varint(8));
  const std::string second = LengthDelimited(2, LengthDelimited(2, "abc"));
  const std::string third = LengthDelimited(2, Tag(1, 0) + Varint(0));
  for (const std::string& message :
       {first + second, second + first, first + second + third}) {
    absl::StatusOr<MessageKind> kind = ExpectRequestAgreesWithProtobuf(message);
    ASSERT_TRUE(kind.ok()) << kind.status();
    EXPECT_EQ(*kind, MessageKind::kChunk);
  }
  // A chunk field of another wire type is an unknown field: no chunk.
  const std::string varint_chunk = Tag(2, 0) + Varint(4);
  EXPECT_EQ(ExpectRequestAgreesWithProtobuf(varint_chunk).value(),
            MessageKind::kOther);
}

TEST(StepCodecTest, RefusesWhatProtobufRefuses) {
  const std::string chunk = Tag(1, 0) + Varint(3) + LengthDelimited(2, "abc");
  const std::vector<std::string> malformed = {
      // Wire types 6 and 7, field number 0.
      Tag(5, 6) + Varint(1),
      Tag(5, 7) + Varint(1),
      Tag(0, 0) + Varint(1),
      LengthDelimited(2, Tag(0, 2) + Varint(0)),
      // End-groups without their start, or of another field.
      Tag(5, 4),
      LengthDelimited(2, chunk + Tag(5, 4)),
      Tag(5, 3) + Tag(6, 4),
      Tag(5, 3) + Varint(1),
      // A varint of 11 bytes; a tag of 6.
      Tag(5, 0) + std::string(10, '\x80') + std::string(1, '\x01'),
      std::string(5, '\x80') + std::string(1, '\x01'),
      // A length of 6 bytes, or of 2 GiB, or past the end.
      Tag(2, 2) + std::string("\x80\x80\x80\x80\x80\x00", 6),
      Tag(2, 2) + std::string("\x80\x80\x80\x80\x08", 5),
      Tag(2, 2) + Varint(100) + chunk,
      LengthDelimited(2, Tag(2, 2) + Varint(50) + "abc"),
      // Fixed-width values cut short.
      Tag(5, 1) + "1234567",
      Tag(5, 5) + "123",
  };
  for (const std::string& message : malformed) {
    absl::StatusOr<MessageKind> kind = ExpectRequestAgreesWithProtobuf(message);
    EXPECT_FALSE(kind.ok());
  }
  // Every truncation of a valid chunk message.
  const std::string whole = LengthDelimited(2, chunk);
  for (size_t size = 1; size < whole.size(); ++size) {
    absl::StatusOr<MessageKind> kind =
        ExpectRequestAgreesWithProtobuf(whole.substr(0, size));
    EXPECT_FALSE(kind.ok()) << "truncated to " << size << " bytes";
  }
}

TEST(StepCodecTest, ErrorsSayWhatIsWrongAndWhere) {
  ChunkFields chunk;
  const std::string bytes = LengthDelimited(2, "") + Tag(5, 7);
  absl::StatusOr<MessageKind> kind =
      ParseChunkMessage({bytes}, StepMessage::kRequest, &chunk);
  ASSERT_FALSE(kind.ok());
  EXPECT_EQ(kind.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(kind.status().message(),
            "malformed protobuf message: wire type 7 at byte 2");
}

// Random corruptions of valid chunk messages: whatever the codec makes of
// them, protobuf must agree.
TEST(StepCodecTest, AgreesWithProtobufOnCorruptedMessages) {
  v1::StepRequest request;
  request.mutable_chunk()->set_index(300);
  request.mutable_chunk()->set_payload(Payload(20));
  const std::string valid =
      Tag(9, 0) + Varint(1) + request.SerializeAsString() +
      LengthDelimited(2, Tag(13, 3) + Tag(1, 0) + Varint(2) + Tag(13, 4));
  std::mt19937 random(12345);
  int chunks = 0;
  for (int trial = 0; trial < 5000; ++trial) {
    std::string bytes = valid;
    const int edits = 1 + static_cast<int>(random() % 3);
    for (int e = 0; e < edits; ++e) {
      const size_t at = random() % bytes.size();
      switch (random() % 3) {
        case 0:
          bytes[at] = static_cast<char>(random());
          break;
        case 1:
          bytes.erase(at, 1);
          break;
        default:
          bytes.insert(at, 1, static_cast<char>(random()));
          break;
      }
      if (bytes.empty()) bytes = valid;
    }
    absl::StatusOr<MessageKind> kind = ExpectRequestAgreesWithProtobuf(bytes);
    if (kind.ok() && *kind == MessageKind::kChunk) ++chunks;
    if (::testing::Test::HasFailure()) {
      FAIL() << "trial " << trial << ": " << absl::BytesToHexString(bytes);
    }
  }
  EXPECT_GT(chunks, 100);  // the corruptions also leave valid chunks
}

TEST(StepCodecTest, CopiesPayloadsAcrossPieces) {
  const std::string bytes = "0123456789";
  const std::vector<absl::string_view> pieces = {
      absl::string_view(bytes).substr(0, 3), absl::string_view(),
      absl::string_view(bytes).substr(3, 4),
      absl::string_view(bytes).substr(7)};
  std::string out(6, '.');
  CopyMessageBytes(pieces, 2, 6, out.data());
  EXPECT_EQ(out, "234567");
}

}  // namespace
}  // namespace depot::wire
