// Protobuf's wire format written by hand, for tests that send encodings the
// generated serializer never writes (fields out of order, unknown fields,
// repeated occurrences) or malformed bytes.
#ifndef DEPOT_TESTS_INTEGRATION_PROTOBUF_BYTES_H_
#define DEPOT_TESTS_INTEGRATION_PROTOBUF_BYTES_H_

#include <cstdint>
#include <string>

namespace depot::testing {

inline std::string Varint(uint64_t value) {
  std::string out;
  while (value >= 0x80) {
    out.push_back(static_cast<char>(value | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
  return out;
}

// A field's tag: wire type 0 varint, 1 fixed64, 2 length-delimited,
// 3 start-group, 4 end-group, 5 fixed32.
inline std::string Tag(uint32_t field, uint32_t wire_type) {
  return Varint(uint64_t{field} << 3 | wire_type);
}

inline std::string LengthDelimited(uint32_t field, const std::string& bytes) {
  return Tag(field, 2) + Varint(bytes.size()) + bytes;
}

}  // namespace depot::testing

#endif  // DEPOT_TESTS_INTEGRATION_PROTOBUF_BYTES_H_
