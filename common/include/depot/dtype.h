// Element types on the wire and their conversions to and from fp32.
//
// Narrowing conversions round to nearest, ties to even; NaN stays NaN (made quiet,
// sign kept), Inf stays Inf, and values beyond the target's range become Inf.
// fp16 subnormals are produced and read exactly.
#ifndef DEPOT_DTYPE_H_
#define DEPOT_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"
#include "depot/export.h"

namespace depot {

// Values equal the wire enum depot.v1.DType.
enum class DType : uint8_t {
  kFloat32 = 1,
  kBFloat16 = 2,
  kFloat16 = 3,
};

// Bytes per element.
DEPOT_API size_t DTypeSize(DType dtype);

// "fp32", "bf16", "fp16".
DEPOT_API std::string_view DTypeName(DType dtype);

// Parses "fp32" | "float32", "bf16" | "bfloat16", "fp16" | "float16".
DEPOT_API absl::StatusOr<DType> ParseDType(std::string_view name);

// REQUIRES: value is 1, 2 or 3. INVALID_ARGUMENT otherwise.
DEPOT_API absl::StatusOr<DType> DTypeFromWire(int value);

DEPOT_API uint16_t FloatToBFloat16(float value);
DEPOT_API float BFloat16ToFloat(uint16_t bits);
DEPOT_API uint16_t FloatToHalf(float value);
DEPOT_API float HalfToFloat(uint16_t bits);

// Converts n elements of src_dtype at `src` to fp32 at `dst`. `src` need not be
// aligned.
DEPOT_API void ConvertToFloat(DType src_dtype, const void* src, float* dst,
                              size_t n);

// Converts n fp32 elements to dst_dtype at `dst`. `dst` need not be aligned.
DEPOT_API void ConvertFromFloat(const float* src, DType dst_dtype, void* dst,
                                size_t n);

}  // namespace depot

#endif  // DEPOT_DTYPE_H_
