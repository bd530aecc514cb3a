// How the kernels read and write their state slots in the slot's storage
// dtype (Megatron's precision-aware optimizer: exp_avg / exp_avg_sq in bf16).
// A kernel's inner loop is a template over the slots' element types, `float`
// for fp32 and `uint16_t` (the bit pattern) for bf16, chosen once per Update
// call; it loads each slot element into fp32 with LoadSlot, computes in fp32
// and stores with StoreSlot. Loading and storing inside the one fused loop
// keeps the pass over memory single, and fp32 slots compile to exactly the
// plain loads and stores they were.
#ifndef DEPOT_SERVER_OPTIMIZER_SLOT_STORAGE_H_
#define DEPOT_SERVER_OPTIMIZER_SLOT_STORAGE_H_

#include <bit>
#include <cstdint>
#include <utility>

#include "depot/dtype.h"
#include "depot/job_config.h"
#include "server/optimizer/host_device.h"

namespace depot {

// Each state slot's storage dtype; kFloat32 for slots the optimizer does not
// keep (their pointers are null and never read). As many as ParamRun::slots
// (optimizer_kernel.cc checks).
struct SlotFormat {
  DType dtypes[3] = {DType::kFloat32, DType::kFloat32, DType::kFloat32};

  // REQUIRES: ValidateOptimizerConfig(config).ok().
  static SlotFormat Of(const OptimizerConfig& config) {
    SlotFormat format;
    for (int k = 0; k < OptimizerStateSlots(config); ++k) {
      format.dtypes[k] = OptimizerSlotDType(config, k);
    }
    return format;
  }
};

// Calls f(static_cast<float*>(slot)) for fp32, f(static_cast<uint16_t*>(slot))
// for bf16. Nest calls for kernels with several slots. REQUIRES: dtype is fp32
// or bf16 (ValidateOptimizerConfig).
template <typename F>
decltype(auto) WithTypedSlot(DType dtype, void* slot, F&& f) {
  if (dtype == DType::kBFloat16) {
    return std::forward<F>(f)(static_cast<uint16_t*>(slot));
  }
  return std::forward<F>(f)(static_cast<float*>(slot));
}

// LoadSlot and StoreSlot are DEPOT_HOST_DEVICE: the GPU kernels
// (client/src/gpu/device_ops.h) read and write bf16 with this same code.
DEPOT_HOST_DEVICE inline float LoadSlot(float value) { return value; }

// Exact: every bf16 value is an fp32 value.
DEPOT_HOST_DEVICE inline float LoadSlot(uint16_t bf16) {
  return std::bit_cast<float>(static_cast<uint32_t>(bf16) << 16);
}

DEPOT_HOST_DEVICE inline void StoreSlot(float& slot, float value) {
  slot = value;
}

// Rounds to nearest, ties to even; NaN stays a (quiet) NaN with its sign and
// the top of its payload; values beyond bf16's range become Inf. Bit for bit
// FloatToBFloat16 (depot/dtype.h), written here so that it inlines into the
// kernels' loops and vectorises (bf16_moments_test.cc checks every bf16 value
// and every rounding case against it).
DEPOT_HOST_DEVICE inline void StoreSlot(uint16_t& slot, float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  // Adding 0x7fff plus the kept half's lowest bit carries into the kept half
  // exactly when the dropped half is above 0x8000, or equal to it with an odd
  // kept half. A carry out of the mantissa gives the next binade, or Inf.
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  // The quiet bit keeps a NaN a NaN when its surviving payload bits are zero.
  const uint32_t quiet_nan = (bits >> 16) | 0x0040u;
  const bool is_nan = (bits & 0x7fffffffu) > 0x7f800000u;
  slot = static_cast<uint16_t>(is_nan ? quiet_nan : rounded);
}

}  // namespace depot

#endif  // DEPOT_SERVER_OPTIMIZER_SLOT_STORAGE_H_
