#include "server/gradient_sum.h"

#include <algorithm>

#include "server/step_numerics.h"

namespace depot {
namespace {

// Elements converted per block: small enough that a block of the sum stays in
// L1/L2 while each worker's part is added to it.
constexpr size_t kBlockElems = 4096;

}  // namespace

void SumGradients(DType dtype, const std::vector<std::string>& payloads,
                  float* sum, size_t n, float scale) {
  const size_t elem_bytes = DTypeSize(dtype);
  float part[kBlockElems];
  for (size_t begin = 0; begin < n; begin += kBlockElems) {
    const size_t m = std::min(kBlockElems, n - begin);
    float* block = sum + begin;
    ConvertToFloat(dtype, payloads[0].data() + begin * elem_bytes, block, m);
    for (size_t w = 1; w < payloads.size(); ++w) {
      ConvertToFloat(dtype, payloads[w].data() + begin * elem_bytes, part, m);
      for (size_t i = 0; i < m; ++i) block[i] += part[i];
    }
    // While the block is still in cache.
    if (scale != 1.0f) ScaleGradient(scale, block, m);
  }
}

}  // namespace depot
