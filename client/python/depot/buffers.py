"""Element types and zero-copy access to NumPy arrays and torch tensors.

The library reads and writes flat host buffers through raw pointers. A buffer
is passed without a copy when it is a C-contiguous NumPy array or a
contiguous CPU torch tensor of the right element type and size; anything else
is refused (ValueError / TypeError) rather than silently copied, so that a
caller never writes weights into a temporary.

NumPy has no bfloat16: bf16 buffers are torch.bfloat16 tensors, or NumPy
uint16 arrays holding the raw bf16 bits.
"""

from __future__ import annotations

import enum
import sys
from typing import TYPE_CHECKING, Any, Dict, Union

import numpy as np

if TYPE_CHECKING:
    import torch

# What the library reads and writes: a NumPy array or a CPU torch tensor
# (torch is imported only when the caller already uses it).
Buffer = Union[np.ndarray, "torch.Tensor"]


class DType(enum.IntEnum):
    """Element types; the values of DEPOT_DTYPE_* in depot.h."""

    FP32 = 1
    BF16 = 2
    FP16 = 3

    @property
    def itemsize(self) -> int:
        return 4 if self is DType.FP32 else 2

    @property
    def numpy_dtype(self) -> np.dtype:
        """The NumPy dtype that holds this type (bf16: its raw bits)."""
        return _NUMPY_DTYPES[self]


# An element type: a DType, a name ("fp32", "bfloat16", ...) or a torch dtype.
DTypeLike = Union[DType, str, "torch.dtype"]

_NUMPY_DTYPES: Dict[DType, np.dtype] = {
    DType.FP32: np.dtype(np.float32),
    DType.BF16: np.dtype(np.uint16),
    DType.FP16: np.dtype(np.float16),
}

_NAMES = {
    "fp32": DType.FP32, "float32": DType.FP32,
    "bf16": DType.BF16, "bfloat16": DType.BF16,
    "fp16": DType.FP16, "float16": DType.FP16,
}


def parse_dtype(value: DTypeLike) -> DType:
    """A DType from a DType, "fp32" / "float32" / "bf16" / "bfloat16" / "fp16"
    / "float16", or a torch dtype of those types. ValueError otherwise."""
    if isinstance(value, DType):
        return value
    if isinstance(value, str) and value.lower() in _NAMES:
        return _NAMES[value.lower()]
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.dtype):
        for dtype, torch_dtype in _torch_dtypes(torch).items():
            if value == torch_dtype:
                return dtype
    raise ValueError(
        f"unsupported element type {value!r}: use fp32, bf16 or fp16")


def _torch_dtypes(torch: Any) -> Dict[DType, Any]:
    return {DType.FP32: torch.float32, DType.BF16: torch.bfloat16,
            DType.FP16: torch.float16}


def buffer_address(buffer: Buffer, dtype: DType, numel: int, *,
                   writable: bool, what: str) -> int:
    """The address of `buffer`'s first element, after checking that it is a
    contiguous host buffer of `numel` elements of `dtype` (a DType) that the
    library may read (and write, when `writable`). `what` names the argument
    in errors. The caller must keep `buffer` alive during the C call."""
    torch = sys.modules.get("torch")  # a tensor exists only if torch is loaded
    if torch is not None and isinstance(buffer, torch.Tensor):
        return _tensor_address(torch, buffer, dtype, numel, what)
    if isinstance(buffer, np.ndarray):
        return _array_address(buffer, dtype, numel, writable, what)
    raise TypeError(
        f"{what} must be a NumPy array or a torch tensor, not "
        f"{type(buffer).__name__}")


def _check_numel(actual: int, numel: int, what: str) -> None:
    if actual != numel:
        raise ValueError(
            f"{what} has {actual} elements, the job's flat buffers have "
            f"{numel} (Job.total_elems)")


def _array_address(array: np.ndarray, dtype: DType, numel: int,
                   writable: bool, what: str) -> int:
    if array.dtype != dtype.numpy_dtype:
        raise ValueError(
            f"{what} has dtype {array.dtype}, this buffer is {dtype.name} "
            f"(NumPy {dtype.numpy_dtype})")
    _check_numel(array.size, numel, what)
    if not array.flags.c_contiguous:
        raise ValueError(f"{what} is not C-contiguous (np.ascontiguousarray "
                         f"makes a contiguous copy)")
    if writable and not array.flags.writeable:
        raise ValueError(f"{what} is read-only, and the library writes it")
    return array.ctypes.data


def _tensor_address(torch: Any, tensor: Any, dtype: DType, numel: int,
                    what: str) -> int:
    if tensor.device.type != "cpu":
        raise ValueError(
            f"{what} is on {tensor.device}; Depot reads and writes host "
            f"memory: pass a CPU tensor")
    expected = _torch_dtypes(torch)[dtype]
    if tensor.dtype != expected:
        raise ValueError(
            f"{what} has dtype {tensor.dtype}, this buffer is {dtype.name} "
            f"({expected})")
    _check_numel(tensor.numel(), numel, what)
    if not tensor.is_contiguous():
        raise ValueError(
            f"{what} is not contiguous (.contiguous() makes a copy)")
    return tensor.data_ptr()
