"""depot.GradScaler: the C++ loss scaler (depot/grad_scaler.h) of a job.

Megatron's semantics, decided by the job's config rather than re-implemented
here: constant at optimizer.loss_scale when it is > 0; dynamic (initial
2**32 by default, halved after `hysteresis` overflowing steps, doubled after
`loss_scale_window` clean ones) when loss_scale is 0 and the gradients are
fp16; otherwise a constant 1.

    scaler = depot.GradScaler(job)
    (loss * scaler.scale).backward()
    result = job.step(step, grads, weights, loss_scale=scaler.scale)
    scaler.update(result.found_inf)

The scale is local state of each worker; every worker sees the same
found_inf (the servers commit one decision), so the scales stay equal.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Dict, Mapping, Union

from depot import _capi
from depot._handle import OwnedHandle

if TYPE_CHECKING:
    from depot.client import Job


class GradScaler(OwnedHandle):
    """The loss scaler Megatron builds for `job`'s config (a depot.Job).
    InvalidArgumentError naming the config field when it is invalid."""

    _DESTROY = "depot_grad_scaler_destroy"

    def __init__(self, job: Job) -> None:
        handle = ctypes.c_void_p()
        _capi.check(_capi.lib().depot_grad_scaler_create(
            job._live_handle(), ctypes.byref(handle)))
        self._handle = handle

    @property
    def scale(self) -> float:
        """The loss scale to multiply the loss by (> 0)."""
        return _capi.lib().depot_grad_scaler_scale(self._live_handle())

    def update(self, found_inf: bool) -> None:
        """Feeds back a step's StepResult.found_inf."""
        _capi.lib().depot_grad_scaler_update(self._live_handle(),
                                             int(bool(found_inf)))

    def state_dict(self) -> Dict[str, Union[int, float]]:
        """Megatron's DynamicGradScaler.state_dict(): scale, growth_tracker,
        hysteresis_tracker (a constant scaler: its scale, zero trackers)."""
        state = _capi.GradScalerState()
        _capi.check(_capi.lib().depot_grad_scaler_get_state(
            self._live_handle(), ctypes.byref(state)))
        return {name: getattr(state, name)
                for name, _ in _capi.GradScalerState._fields_}

    def load_state_dict(self,
                        state_dict: Mapping[str, Union[int, float]]) -> None:
        """Restores a state_dict() (a constant scaler ignores it).
        InvalidArgumentError naming the field when it does not fit this
        scaler's config; then nothing changes."""
        state = _capi.GradScalerState(
            scale=float(state_dict["scale"]),
            growth_tracker=int(state_dict["growth_tracker"]),
            hysteresis_tracker=int(state_dict["hysteresis_tracker"]))
        _capi.check(_capi.lib().depot_grad_scaler_load_state(
            self._live_handle(), ctypes.byref(state)))

