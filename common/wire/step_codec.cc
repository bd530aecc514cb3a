#include "wire/step_codec.h"

#include <algorithm>
#include <climits>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace depot::wire {
namespace {

// Protobuf's wire types.
enum WireType : uint32_t {
  kVarint = 0,
  kFixed64 = 1,
  kLengthDelimited = 2,
  kStartGroup = 3,
  kEndGroup = 4,
  kFixed32 = 5,
};

// Fields of message Chunk.
constexpr uint32_t kChunkIndexField = 1;
constexpr uint32_t kChunkPayloadField = 2;

// Protobuf's default recursion limit: nested messages and groups.
constexpr int kMaxDepth = 100;

uint32_t ChunkField(StepMessage message) {
  return message == StepMessage::kRequest ? 2 : 1;
}

// Whether `field` is a member of the message's oneof other than its chunk
// (StepRequest: header 1, commit 3, weights_override 4; StepResponse: stats
// 2, ack 3, grad_stats 4, grad_sum 5). step_codec_test checks this list against
// the messages' descriptors, so that a member added to the .proto is not read
// as an unknown field here (weights_override was, until issue 13's fuzzing:
// a chunk followed by a weights_override was taken for a chunk).
bool IsOtherOneofMember(StepMessage message, uint32_t field) {
  if (message == StepMessage::kRequest) {
    return field == 1 || field == 3 || field == 4;
  }
  return field >= 2 && field <= 5;
}

char* PutVarint(uint64_t value, char* out) {
  while (value >= 0x80) {
    *out++ = static_cast<char>(value | 0x80);
    value >>= 7;
  }
  *out++ = static_cast<char>(value);
  return out;
}

size_t VarintSize(uint64_t value) {
  size_t size = 1;
  while (value >= 0x80) {
    value >>= 7;
    ++size;
  }
  return size;
}

char Tag(uint32_t field, WireType type) {
  return static_cast<char>(field << 3 | type);  // fields < 16: one byte
}

// Reads a message's bytes across its pieces, never past `limit` (an offset
// from the message's first byte), reporting what is malformed and where as
// protobuf's parser would refuse it.
class Reader {
 public:
  explicit Reader(MessagePieces pieces) : pieces_(pieces) {
    for (absl::string_view piece : pieces) size_ += piece.size();
  }

  uint64_t size() const { return size_; }
  uint64_t offset() const { return offset_; }

  absl::Status ReadByte(uint64_t limit, uint8_t* byte) {
    if (offset_ >= limit) return Malformed("truncated field");
    while (pos_ == pieces_[piece_].size()) {
      ++piece_;
      pos_ = 0;
    }
    *byte = static_cast<uint8_t>(pieces_[piece_][pos_++]);
    ++offset_;
    return absl::OkStatus();
  }

  absl::Status Skip(uint64_t bytes, uint64_t limit) {
    if (bytes > limit - offset_) return Malformed("truncated field");
    offset_ += bytes;
    while (bytes > 0) {
      const uint64_t here =
          std::min<uint64_t>(bytes, pieces_[piece_].size() - pos_);
      pos_ += here;
      bytes -= here;
      if (bytes > 0) {
        ++piece_;
        pos_ = 0;
      }
    }
    return absl::OkStatus();
  }

  // A varint of at most `max_bytes` bytes; bits above 64 are dropped, as
  // protobuf drops them.
  absl::Status ReadVarint(uint64_t limit, int max_bytes, uint64_t* value) {
    *value = 0;
    for (int i = 0; i < max_bytes; ++i) {
      uint8_t byte = 0;
      if (absl::Status s = ReadByte(limit, &byte); !s.ok()) return s;
      if (i < 10) *value |= static_cast<uint64_t>(byte & 0x7f) << (7 * i);
      if ((byte & 0x80) == 0) return absl::OkStatus();
    }
    return Malformed(absl::StrCat("varint longer than ", max_bytes, " bytes"));
  }

  // A tag: a varint of at most 5 bytes, kept to its low 32 bits.
  absl::Status ReadTag(uint64_t limit, uint32_t* field, uint32_t* type) {
    const uint64_t at = offset_;
    uint64_t tag = 0;
    if (absl::Status s = ReadVarint(limit, 5, &tag); !s.ok()) return s;
    tag &= 0xffffffffu;
    *field = static_cast<uint32_t>(tag >> 3);
    *type = static_cast<uint32_t>(tag & 7);
    if (*type == kEndGroup) {
      return MalformedAt(at, "end-group tag without its start-group");
    }
    if (*field == 0) return MalformedAt(at, "field number 0");
    if (*type > kFixed32) {
      return MalformedAt(at, absl::StrCat("wire type ", *type));
    }
    return absl::OkStatus();
  }

  // The length of a length-delimited field: as protobuf reads it, at most 5
  // bytes and below 2 GiB, and it must fit before `limit`.
  absl::Status ReadLength(uint64_t limit, uint64_t* length) {
    const uint64_t at = offset_;
    if (absl::Status s = ReadVarint(limit, 5, length); !s.ok()) return s;
    if (*length > static_cast<uint64_t>(INT_MAX) - 16) {
      return MalformedAt(at, "length of 2 GiB or more");
    }
    if (*length > limit - offset_) {
      return MalformedAt(at, absl::StrCat("length ", *length, " runs past the ",
                                          limit - offset_, " bytes left"));
    }
    return absl::OkStatus();
  }

  // Skips the value of a field of wire type `type` whose tag was just read.
  absl::Status SkipValue(uint32_t field, uint32_t type, uint64_t limit,
                         int depth) {
    switch (type) {
      case kVarint: {
        uint64_t ignored = 0;
        return ReadVarint(limit, 10, &ignored);
      }
      case kFixed64:
        return Skip(8, limit);
      case kFixed32:
        return Skip(4, limit);
      case kLengthDelimited: {
        uint64_t length = 0;
        if (absl::Status s = ReadLength(limit, &length); !s.ok()) return s;
        return Skip(length, limit);
      }
      case kStartGroup:
        return SkipGroup(field, limit, depth + 1);
    }
    return Malformed(absl::StrCat("wire type ", type));  // ReadTag checked
  }

  absl::Status Malformed(absl::string_view what) const {
    return MalformedAt(offset_, what);
  }

 private:
  // Skips a group's fields up to its end-group tag.
  absl::Status SkipGroup(uint32_t group_field, uint64_t limit, int depth) {
    if (depth > kMaxDepth) return Malformed("groups nested too deep");
    while (true) {
      const uint64_t at = offset_;
      uint64_t tag = 0;
      if (offset_ == limit) return Malformed("group without its end-group");
      if (absl::Status s = ReadVarint(limit, 5, &tag); !s.ok()) return s;
      tag &= 0xffffffffu;
      const uint32_t field = static_cast<uint32_t>(tag >> 3);
      const uint32_t type = static_cast<uint32_t>(tag & 7);
      if (type == kEndGroup) {
        if (field == group_field) return absl::OkStatus();
        return MalformedAt(
            at, absl::StrCat("end-group of field ", field,
                             " in the group of field ", group_field));
      }
      if (field == 0) return MalformedAt(at, "field number 0");
      if (type > kFixed32) {
        return MalformedAt(at, absl::StrCat("wire type ", type));
      }
      if (absl::Status s = SkipValue(field, type, limit, depth); !s.ok()) {
        return s;
      }
    }
  }

  static absl::Status MalformedAt(uint64_t at, absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed protobuf message: ", what, " at byte ", at));
  }

  MessagePieces pieces_;
  uint64_t size_ = 0;
  size_t piece_ = 0;  // the piece holding byte offset_ (or a prior one)
  size_t pos_ = 0;    // offset_'s position in pieces_[piece_]
  uint64_t offset_ = 0;
};

// Parses one occurrence of the chunk field, `length` bytes from the reader's
// offset, merging it into `chunk` as protobuf merges repeated occurrences.
absl::Status ParseChunk(Reader& reader, uint64_t length, ChunkFields* chunk) {
  const uint64_t end = reader.offset() + length;
  while (reader.offset() < end) {
    uint32_t field = 0;
    uint32_t type = 0;
    if (absl::Status s = reader.ReadTag(end, &field, &type); !s.ok()) return s;
    if (field == kChunkIndexField && type == kVarint) {
      if (absl::Status s = reader.ReadVarint(end, 10, &chunk->index); !s.ok()) {
        return s;
      }
    } else if (field == kChunkPayloadField && type == kLengthDelimited) {
      uint64_t size = 0;
      if (absl::Status s = reader.ReadLength(end, &size); !s.ok()) return s;
      chunk->payload_offset = reader.offset();
      chunk->payload_size = size;
      if (absl::Status s = reader.Skip(size, end); !s.ok()) return s;
    } else if (absl::Status s = reader.SkipValue(field, type, end, 1);
               !s.ok()) {
      // (A known field number with another wire type is an unknown field to
      // protobuf too.)
      return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace

ChunkPrefix EncodeChunkPrefix(StepMessage message, uint64_t index,
                              uint64_t payload_bytes) {
  uint64_t chunk_size = 0;
  if (index != 0) chunk_size += 1 + VarintSize(index);
  if (payload_bytes != 0) {
    chunk_size += 1 + VarintSize(payload_bytes) + payload_bytes;
  }
  ChunkPrefix prefix;
  char* out = prefix.bytes;
  *out++ = Tag(ChunkField(message), kLengthDelimited);
  out = PutVarint(chunk_size, out);
  if (index != 0) {
    *out++ = Tag(kChunkIndexField, kVarint);
    out = PutVarint(index, out);
  }
  if (payload_bytes != 0) {
    *out++ = Tag(kChunkPayloadField, kLengthDelimited);
    out = PutVarint(payload_bytes, out);
  }
  prefix.size = static_cast<size_t>(out - prefix.bytes);
  return prefix;
}

absl::StatusOr<MessageKind> ParseChunkMessage(MessagePieces pieces,
                                              StepMessage message,
                                              ChunkFields* chunk) {
  Reader reader(pieces);
  const uint64_t end = reader.size();
  const uint32_t chunk_field = ChunkField(message);
  ChunkFields fields;
  bool has_chunk = false;
  while (reader.offset() < end) {
    uint32_t field = 0;
    uint32_t type = 0;
    if (absl::Status s = reader.ReadTag(end, &field, &type); !s.ok()) return s;
    if (type == kLengthDelimited && field == chunk_field) {
      uint64_t length = 0;
      if (absl::Status s = reader.ReadLength(end, &length); !s.ok()) return s;
      if (absl::Status s = ParseChunk(reader, length, &fields); !s.ok()) {
        return s;
      }
      has_chunk = true;
    } else if (type == kLengthDelimited && IsOtherOneofMember(message, field)) {
      // Which member wins, and whether that member's own fields are valid,
      // is protobuf's to say.
      return MessageKind::kOther;
    } else if (absl::Status s = reader.SkipValue(field, type, end, 0);
               !s.ok()) {
      return s;
    }
  }
  if (!has_chunk) return MessageKind::kOther;
  *chunk = fields;
  return MessageKind::kChunk;
}

void CopyMessageBytes(MessagePieces pieces, uint64_t offset, uint64_t size,
                      void* out) {
  char* dst = static_cast<char*>(out);
  for (absl::string_view piece : pieces) {
    if (size == 0) return;
    if (offset >= piece.size()) {
      offset -= piece.size();
      continue;
    }
    const uint64_t here = std::min<uint64_t>(size, piece.size() - offset);
    std::memcpy(dst, piece.data() + offset, here);
    dst += here;
    size -= here;
    offset = 0;
  }
}

}  // namespace depot::wire
