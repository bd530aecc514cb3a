"""depot.Client and depot.Job: the C API (depot.h) as Python objects.

    client = depot.Client(["10.0.0.1:50051", "10.0.0.2:50051"])
    client.wait_for_servers(30)
    job = client.open_job("run3", [("w", 4096, 0), ("b", 64, 1)],
                          optimizer="adamw", lr=3e-4)
    job.init_weights(initial)                  # N = job.total_elems elements
    for step in range(1, steps + 1):
        job.step(step, grads, weights)         # weights updated in place

Every method raises a depot.DepotError subclass when the call fails. The
library runs without the GIL, so other Python threads keep running during a
step. A Client may be shared by threads; a Job serializes its own calls.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import sys
import threading
from typing import (Any, Dict, Iterable, List, Mapping, NamedTuple, Optional,
                    Sequence, Tuple, Union)

import numpy as np

from depot import _capi, errors
from depot._handle import OwnedHandle
from depot.buffers import (Buffer, DType, DTypeLike, buffer_address,
                           parse_dtype)


class TensorSpec(NamedTuple):
    """One tensor of a job's layout."""

    name: str
    numel: int
    param_group: int


class GroupHyperParams(NamedTuple):
    """This step's lr and weight decay of one group."""

    param_group: int
    lr: float
    weight_decay: float


class StepCommit(NamedTuple):
    """A step's clip decision, when the trainer already knows it: skip it, or
    multiply the unscaled gradients by clip_coef (in (0, 1])."""

    clip_coef: float = 1.0
    skip: bool = False


OPTIMIZER_KINDS = {"adamw": 1, "adam": 2, "sgd": 3, "adagrad": 4, "lion": 5}
GRAD_NORM_TYPES = {"l2": 1, "inf": 2}
_DTYPE_FIELDS = ("exp_avg_dtype", "exp_avg_sq_dtype")


@dataclasses.dataclass(frozen=True)
class StepResult:
    """The outcome of one step, summed over the servers (depot.h)."""

    step: int
    chunks: int
    chunks_replayed: int
    bytes_sent: int
    bytes_received: int
    update_seconds: float
    wall_seconds: float
    two_phase: bool
    grad_norm: float
    zero_count: int
    found_inf: bool
    skipped: bool
    clip_coef: float
    # An engine with an offload fraction: a send of its kept state into the
    # servers' checkpoint captures of step capture_step (0: none reported)
    # that ended since the last report (the send runs behind the steps):
    # the chunks it sent, and why the rest could not be ("" when none
    # failed; the steps stand either way).
    capture_step: int = 0
    capture_chunks: int = 0
    capture_error: str = ""


def _step_result(result: "_capi.StepResult") -> StepResult:
    def value(name, ctype):
        if ctype is _capi.c_int32:
            return bool(getattr(result, name))
        if name == "capture_error":
            return getattr(result, name).decode(errors="replace")
        return getattr(result, name)
    return StepResult(**{name: value(name, ctype)
                         for name, ctype in _capi.StepResult._fields_})


@dataclasses.dataclass
class FlatState:
    """A job's whole optimizer state as flat float32 arrays over
    [0, total_elems) (Job.decode_state / encode_state): the fp32 master
    weights, each state slot (Adam: exp_avg, exp_avg_sq[, max_exp_avg_sq];
    SGD: momentum_buffer; Adagrad: sum; Lion: exp_avg), each tensor's
    optimizer step count, and the last step the servers applied."""

    applied_step: int
    master: np.ndarray
    slots: list
    tensor_steps: np.ndarray


@dataclasses.dataclass(frozen=True)
class ServerStatus:
    """One server's view of a job. pending_step: the oldest step still
    waiting for workers there (0: none); missing_workers: the ranks that have
    not sent some chunk of it that another worker has sent; waiting_seconds:
    how long it has waited."""

    server: str
    job_id: int
    step: int
    shard_begin: int
    shard_end: int
    state_bytes: int
    state_checksum: int
    pending_step: int = 0
    missing_workers: Tuple[int, ...] = ()
    waiting_seconds: float = 0.0


def optimizer_defaults() -> Dict[str, Union[int, float]]:
    """The library's OptimizerConfig defaults, by field name (Megatron's)."""
    config = _capi.JobConfig()
    _capi.lib().depot_job_config_init(ctypes.byref(config))
    return {name: getattr(config.optimizer, name)
            for name, _ in _capi.OptimizerConfig._fields_ if name != "kind"}


_BOOL_FIELDS = ("sgd_nesterov", "amsgrad", "maximize")


def _set_optimizer_fields(c_config: _capi.OptimizerConfig, kind: str,
                          fields: Mapping[str, Any]) -> None:
    try:
        c_config.kind = OPTIMIZER_KINDS[kind.lower()]
    except KeyError:
        raise ValueError(f"unknown optimizer {kind!r}; one of "
                         f"{', '.join(OPTIMIZER_KINDS)}") from None
    known = {name for name, _ in _capi.OptimizerConfig._fields_} - {"kind"}
    for name, value in fields.items():
        if name not in known:
            raise TypeError(f"unknown optimizer field {name!r}; the fields "
                            f"are {', '.join(sorted(known))}")
        if name in _DTYPE_FIELDS:
            value = int(parse_dtype(value))
        elif name == "clip_grad_norm_type" and isinstance(value, str):
            value = GRAD_NORM_TYPES[value.lower()]
        elif name in _BOOL_FIELDS:
            value = int(bool(value))
        setattr(c_config, name, value)


class Client(OwnedHandle):
    """Connections to the Depot servers of a run.

    `servers` lists "host:port" of each server, in the same order on every
    worker. Connecting does not wait for them; wait_for_servers does.
    Timeouts are in seconds (None: the library's default): rpc_timeout for
    unary calls, step_timeout for a whole step; unavailable_retry is how long
    a step keeps resending a server's stream after UNAVAILABLE (a cut
    connection, a restarting server; 0: never).

    Security (docs/security.md): `tls_ca` is the PEM file of the CA that
    signed the servers' certificates (TLS); `tls_cert` and `tls_key` this
    client's certificate and key (mTLS); `token` the bearer token that names
    the tenant, or `token_file` a file whose first line is it. A token or a
    client certificate needs `tls_ca`.

    `retain_transport_buffers=True` (opt-in, for the whole process) sets
    glibc malloc's mmap and trim thresholds so that gRPC's receive buffers
    are reused instead of faulted in again: about a third less CPU per
    transfer, and the process keeps up to 64 MiB of freed memory per malloc
    arena. The thresholds stay set for the life of the process; malloc
    settings in the environment win (docs/protocol.md, "Transport").
    """

    _DESTROY = "depot_client_destroy"

    def __init__(self, servers: Union[str, Sequence[str]], *,
                 rpc_timeout: Optional[float] = None,
                 step_timeout: Optional[float] = None,
                 max_inflight_chunks: Optional[int] = None,
                 connections_per_server: Optional[int] = None,
                 unavailable_retry: Optional[float] = None,
                 tls_ca: Optional[str] = None,
                 tls_cert: Optional[str] = None,
                 tls_key: Optional[str] = None,
                 token: Optional[str] = None,
                 token_file: Optional[str] = None,
                 retain_transport_buffers: bool = False) -> None:
        if isinstance(servers, str):
            servers = [servers]
        if not isinstance(retain_transport_buffers, bool):
            raise TypeError(f"retain_transport_buffers must be True or "
                            f"False, not {retain_transport_buffers!r}")
        self.servers = list(servers)
        lib = _capi.lib()
        options = _capi.ClientOptions()
        lib.depot_client_options_init(ctypes.byref(options))
        if rpc_timeout is not None:
            options.rpc_timeout_seconds = rpc_timeout
        if step_timeout is not None:
            options.step_timeout_seconds = step_timeout
        if max_inflight_chunks is not None:
            options.max_inflight_chunks = max_inflight_chunks
        if connections_per_server is not None:
            options.connections_per_server = connections_per_server
        if unavailable_retry is not None:
            options.unavailable_retry_seconds = unavailable_retry
        # The bytes objects stay referenced until depot_client_create, which
        # copies them.
        credentials = {
            "tls_ca_file": tls_ca, "tls_cert_file": tls_cert,
            "tls_key_file": tls_key, "auth_token": token,
            "auth_token_file": token_file,
        }
        encoded = {field: os.fsencode(value) if field != "auth_token"
                   else value.encode()
                   for field, value in credentials.items() if value}
        for field, value in encoded.items():
            setattr(options, field, value)
        if retain_transport_buffers:
            lib.depot_retain_transport_buffers()
        addresses = (ctypes.c_char_p * len(self.servers))(
            *[s.encode() for s in self.servers])
        handle = ctypes.c_void_p()
        _capi.check(lib.depot_client_create(
            addresses, len(self.servers), ctypes.byref(options),
            ctypes.byref(handle)))
        self._handle = handle

    def wait_for_servers(self, timeout: float = 30.0) -> None:
        """Waits until every server reports SERVING on its health service.
        UnavailableError (naming the server) if one does not in time."""
        _capi.check(_capi.lib().depot_client_wait_for_servers(
            self._live_handle(), float(timeout)))

    def open_job(self, name: str,
                 tensors: Iterable[Union[TensorSpec, Tuple[str, int, int]]],
                 *, worker_rank: int = 0, num_workers: int = 1,
                 optimizer: str = "adamw", grad_dtype: DTypeLike = "fp32",
                 weight_dtype: DTypeLike = "fp32",
                 chunk_elems: Optional[int] = None,
                 alignment_elems: Optional[int] = None,
                 group_optimizers: Optional[Iterable[Mapping[str, Any]]] = None,
                 checkpoint_every_steps: int = 0,
                 **optimizer_fields: Any) -> Job:
        """Creates the job on every server, or attaches to an identical one.

        `tensors`: (name, numel, param_group) per tensor, in layout order.
        `optimizer`: "adamw", "adam", "sgd", "adagrad" or "lion".
        `optimizer_fields`: OptimizerConfig fields by their Megatron names
        (lr, weight_decay, adam_beta1, adam_beta2, adam_eps, sgd_momentum,
        sgd_dampening, sgd_nesterov, ...; depot/job_config.h); the others keep
        the library's defaults (optimizer_defaults()).
        `group_optimizers`: None (every param group uses the fields above),
        or one dict per param group 0..G-1 of overrides of those fields (e.g.
        {"adam_beta1": 0.8, "amsgrad": True}); each group's config is the
        job's with its overrides, and may differ only in the optimizer's
        hyperparameters (depot/job_config.h).
        `checkpoint_every_steps`: the servers checkpoint this job every this
        many steps (0: their --checkpoint_every_steps); not part of the
        job's identity (a worker attaching with another value gets the
        job's). FailedPreconditionError on a server without
        --checkpoint_dir when it is set.
        FailedPreconditionError when a job of that name has another config.
        """
        specs = [TensorSpec(*t) for t in tensors]
        c_tensors = (_capi.TensorSpec * len(specs))(*[
            _capi.TensorSpec(s.name.encode(), s.numel, s.param_group)
            for s in specs])
        config = _capi.JobConfig()
        lib = _capi.lib()
        lib.depot_job_config_init(ctypes.byref(config))
        config.name = name.encode()
        config.tensors = c_tensors
        config.num_tensors = len(specs)
        config.num_workers = num_workers
        _set_optimizer_fields(config.optimizer, optimizer, optimizer_fields)
        groups = list(group_optimizers or ())
        # Each group's config: the job's, with the group's overrides.
        c_groups = (_capi.OptimizerConfig * len(groups))(
            *[config.optimizer] * len(groups))
        for c_group, overrides in zip(c_groups, groups):
            _set_optimizer_fields(c_group, optimizer, overrides)
        config.group_optimizers = c_groups
        config.num_group_optimizers = len(groups)
        config.grad_dtype = int(parse_dtype(grad_dtype))
        config.weight_dtype = int(parse_dtype(weight_dtype))
        if chunk_elems is not None:
            config.chunk_elems = chunk_elems
        if alignment_elems is not None:
            config.alignment_elems = alignment_elems
        config.checkpoint_every_steps = checkpoint_every_steps
        handle = ctypes.c_void_p()
        _capi.check(lib.depot_job_open(self._live_handle(),
                                       ctypes.byref(config), worker_rank,
                                       ctypes.byref(handle)))
        return Job(handle, name, specs, worker_rank, num_workers,
                   parse_dtype(grad_dtype), parse_dtype(weight_dtype))

    def close(self) -> None:
        """Frees the connections. Jobs opened on the client stay usable."""
        super().close()


class Job(OwnedHandle):
    """A job opened by Client.open_job, as one worker.

    Buffers are flat over [0, total_elems): tensor i starts at
    tensor_offsets[i]; the gaps are padding. Gradients are grad_dtype and
    weights weight_dtype (see depot.buffers for the accepted types).
    """

    _DESTROY = "depot_job_destroy"

    def __init__(self, handle: ctypes.c_void_p, name: str,
                 tensors: List[TensorSpec], worker_rank: int,
                 num_workers: int, grad_dtype: DType,
                 weight_dtype: DType) -> None:
        lib = _capi.lib()
        self._handle = handle
        self._lock = threading.Lock()  # depot.h: one call at a time per job
        self.name = name
        self.tensors = tensors
        self.worker_rank = worker_rank
        self.num_workers = num_workers
        self.grad_dtype = grad_dtype
        self.weight_dtype = weight_dtype
        self.total_elems: int = lib.depot_job_total_elems(handle)
        self.tensor_offsets: List[int] = [
            lib.depot_job_tensor_offset(handle, i) for i in range(len(tensors))]
        self.fingerprint: int = lib.depot_job_fingerprint(handle)
        self.num_servers: int = lib.depot_job_num_servers(handle)

    def init_weights(self, weights: Buffer) -> None:
        """Sets the master weights from `weights` (total_elems elements of
        fp32, bf16 or fp16). FailedPreconditionError once a step has been
        applied or a peer's step-1 gradient is pending."""
        dtype = _buffer_dtype(weights)
        address = buffer_address(weights, dtype, self.total_elems,
                                 writable=False, what="weights")
        with self._lock:
            _capi.check(_capi.lib().depot_job_init_weights(
                self._live_handle(), address, int(dtype)))

    def step(self, step: int, grads: Buffer, weights_out: Buffer, *,
             group_hparams: Iterable[Union[GroupHyperParams,
                                           Tuple[int, float, float]]] = (),
             loss_scale: float = 1.0,
             known_commit: Optional[Union[StepCommit,
                                          Tuple[float, bool]]] = None,
             no_grad_tensors: Iterable[int] = (),
             weight_overrides: Iterable[Tuple[int, Buffer]] = ()
             ) -> StepResult:
        """Runs step `step` (1, 2, ...) for this worker: sends `grads` and
        writes the updated weights into `weights_out`. Every worker passes the
        same `group_hparams` ((param_group, lr, weight_decay) each),
        `loss_scale` and `known_commit` (a StepCommit, or None).
        This worker's own: `no_grad_tensors`, the tensor indices it has no
        gradient for (a tensor no worker has one for is skipped, as torch
        skips a parameter whose .grad is None); `weight_overrides`,
        (tensor_index, values) pairs of new master weights (values: the
        tensor's numel fp32 elements, a contiguous NumPy array or CPU
        tensor) for tensors changed outside the optimizer. Returns a
        StepResult."""
        grads_address = buffer_address(grads, self.grad_dtype,
                                       self.total_elems, writable=False,
                                       what="grads")
        weights_address = buffer_address(weights_out, self.weight_dtype,
                                         self.total_elems, writable=True,
                                         what="weights_out")
        options, keep = self._step_options(
            group_hparams, loss_scale, known_commit, no_grad_tensors,
            weight_overrides)
        lib = _capi.lib()
        result = _capi.StepResult()
        with self._lock:
            _capi.check(lib.depot_job_step(
                self._live_handle(), step, grads_address, weights_address,
                ctypes.byref(options), ctypes.byref(result)))
        return _step_result(result)

    def _step_options(self, group_hparams, loss_scale, known_commit,
                      no_grad_tensors, weight_overrides):
        """The depot_step_options_t of a step, and the ctypes arrays it
        points into (keep them alive until the call returns)."""
        hparams = [GroupHyperParams(*g) for g in group_hparams]
        c_hparams = (_capi.GroupHyperParams * len(hparams))(*[
            _capi.GroupHyperParams(g.param_group, g.lr, g.weight_decay)
            for g in hparams])
        options = _capi.StepOptions()
        lib = _capi.lib()
        lib.depot_step_options_init(ctypes.byref(options))
        options.group_hparams = c_hparams
        options.num_group_hparams = len(hparams)
        options.loss_scale = loss_scale
        no_grad = list(no_grad_tensors)
        c_no_grad = (_capi.c_uint32 * len(no_grad))(*no_grad)
        options.no_grad_tensors = c_no_grad
        options.num_no_grad_tensors = len(no_grad)
        overrides = list(weight_overrides)
        c_overrides = (_capi.TensorWeights * len(overrides))()
        for c_override, (index, values) in zip(c_overrides, overrides):
            if not 0 <= index < len(self.tensors):
                raise ValueError(f"weight_overrides: tensor {index} is not in "
                                 f"the job's {len(self.tensors)} tensors")
            c_override.tensor_index = index
            c_override.values = ctypes.cast(buffer_address(
                values, DType.FP32, self.tensors[index].numel,
                writable=False, what=f"weight_overrides[{index}]"),
                ctypes.POINTER(ctypes.c_float))
        options.weight_overrides = c_overrides
        options.num_weight_overrides = len(overrides)
        if known_commit is not None:
            commit = StepCommit(*known_commit)
            options.has_known_commit = 1
            options.known_clip_coef = commit.clip_coef
            options.known_skip = int(bool(commit.skip))
        return options, (c_hparams, c_no_grad, c_overrides)

    def pull(self, begin: int = 0, end: Optional[int] = None,
             dtype: DTypeLike = "fp32",
             out: Optional[Buffer] = None, step: int = 0) -> Buffer:
        """Weights [begin, end) as `dtype` (fp32: the master weights exactly),
        into `out` if given, else into a new NumPy array, which is returned.
        Every element is at `step` (0: each server's step in status(), even
        while a later step is half applied there); a worker that rejoins a
        running job pulls at the oldest step its servers report.
        OutOfRangeError unless begin <= end <= total_elems;
        FailedPreconditionError when a server is not yet at `step` or no
        longer holds it (it holds the step it is at and the one before), or
        `dtype` is not the job's weight dtype for a chunk past `step` (unless
        that is fp32)."""
        end = self.total_elems if end is None else end
        dtype = parse_dtype(dtype)
        if out is None:
            out = np.empty(max(end - begin, 0), dtype=dtype.numpy_dtype)
        address = buffer_address(out, dtype, max(end - begin, 0),
                                 writable=True, what="out")
        with self._lock:
            _capi.check(_capi.lib().depot_job_pull_at(
                self._live_handle(), begin, end, int(dtype), step, address))
        return out

    def status(self, with_checksum: bool = False) -> List[ServerStatus]:
        """Each server's ServerStatus, in server order."""
        statuses = (_capi.ServerStatus * self.num_servers)()
        with self._lock:
            _capi.check(_capi.lib().depot_job_status(
                self._live_handle(), int(with_checksum), statuses,
                self.num_servers))
            return [ServerStatus(
                server=s.server.decode(), job_id=s.job_id, step=s.step,
                shard_begin=s.shard_begin, shard_end=s.shard_end,
                state_bytes=s.state_bytes, state_checksum=s.state_checksum,
                pending_step=s.pending_step,
                missing_workers=tuple(s.missing_workers[i] for i in
                                      range(s.num_missing_workers)),
                waiting_seconds=s.waiting_seconds)
                for s in statuses]

    def save_state(self) -> bytes:
        """The job's whole optimizer state (master weights, optimizer slots,
        step counters) as bytes for load_state. Call it between steps.
        save_state_array() gives the same without the copy into bytes."""
        return self.save_state_array().tobytes()

    def save_state_array(self) -> np.ndarray:
        """save_state()'s blob as a 1-D uint8 NumPy array over the buffer the
        library filled, without a copy: the buffer is freed with the last
        array (or torch tensor, torch.from_numpy) over it. torch.save writes
        such a tensor straight from that memory."""
        def call(data, size):
            return _capi.lib().depot_job_save_state(self._live_handle(), data,
                                                    size)
        with self._lock:
            return _library_array(call)

    def load_state(self, state: StateBytes) -> None:
        """Replaces the job's state by `state` (from save_state or
        save_state_array of a job with the same config; the name may differ):
        bytes, bytearray, memoryview, or a contiguous uint8 NumPy array or
        CPU tensor, read in place (no copy). The next step is the saved step
        + 1. DataLossError: corrupt or truncated state;
        FailedPreconditionError: a state of another config."""
        view = _byte_view(state, "state")
        with self._lock:
            _capi.check(_capi.lib().depot_job_load_state(
                self._live_handle(), view.ctypes.data, view.size))

    def decode_state(self, state: StateBytes) -> FlatState:
        """The state in `state` (from save_state or save_state_array of a job
        with this config; any type load_state takes) as a FlatState of NumPy
        arrays over [0, total_elems)."""
        view = _byte_view(state, "state")
        lib = _capi.lib()
        slots = lib.depot_job_num_state_slots(self._live_handle())
        flat = FlatState(
            applied_step=0,
            master=np.zeros(self.total_elems, dtype=np.float32),
            slots=[np.zeros(self.total_elems, dtype=np.float32)
                   for _ in range(slots)],
            tensor_steps=np.zeros(len(self.tensors), dtype=np.uint64))
        c_state = self._c_flat_state(flat)
        with self._lock:
            _capi.check(lib.depot_job_decode_state(
                self._live_handle(), view.ctypes.data, view.size,
                ctypes.byref(c_state)))
        return dataclasses.replace(flat, applied_step=c_state.applied_step)

    def encode_state(self, flat: FlatState) -> bytes:
        """Bytes for load_state holding `flat` (a FlatState: float32
        master and slots of total_elems each, one count per tensor)."""
        slots = _capi.lib().depot_job_num_state_slots(self._live_handle())
        if len(flat.slots) != slots:
            raise ValueError(f"encode_state: {len(flat.slots)} slot arrays, "
                             f"the job keeps {slots}")
        c_state = self._c_flat_state(flat)

        def call(data, size):
            return _capi.lib().depot_job_encode_state(
                self._live_handle(), ctypes.byref(c_state), data, size)
        with self._lock:
            return _library_array(call).tobytes()

    def _c_flat_state(self, flat: FlatState) -> _capi.FlatState:
        def floats(array, what):
            return ctypes.cast(buffer_address(
                array, DType.FP32, self.total_elems, writable=True,
                what=what), ctypes.POINTER(ctypes.c_float))
        c_state = _capi.FlatState()
        c_state.applied_step = int(flat.applied_step)
        c_state.master = floats(flat.master, "master")
        for k, slot in enumerate(flat.slots):
            c_state.slots[k] = floats(slot, f"slots[{k}]")
        steps = np.ascontiguousarray(flat.tensor_steps, dtype=np.uint64)
        if steps.shape != (len(self.tensors),):
            raise ValueError(f"tensor_steps: {steps.shape[0]} counts, the "
                             f"job has {len(self.tensors)} tensors")
        flat.tensor_steps = steps  # keeps the converted array alive
        c_state.tensor_steps = steps.ctypes.data_as(
            ctypes.POINTER(_capi.c_uint64))
        return c_state

    def checkpoint(self) -> int:
        """Has every server write its shard of the job to its
        --checkpoint_dir now (docs/checkpoints.md); returns the step the
        checkpoint holds once every shard is durable. Call it between steps,
        on one worker. FailedPreconditionError: a server has no
        --checkpoint_dir, or a step is in flight; UnavailableError: retry."""
        step = _capi.c_uint64()
        with self._lock:
            _capi.check(_capi.lib().depot_job_checkpoint(
                self._live_handle(), ctypes.byref(step)))
        return step.value

    def reconcile(self) -> Tuple[int, bool]:
        """Makes the job's servers agree again after one restarted: opens the
        job again on every server and, when they are at different steps,
        rolls every server back to the newest step each can return to.
        Returns (step, rolled_back): the step every server is at now, and
        whether a rollback was needed. `step()` calls it by itself when a
        step fails that way, and raises RolledBackError when the job went
        back. DataLossError: a server lost the job."""
        step = _capi.c_uint64()
        rolled_back = ctypes.c_int()
        with self._lock:
            _capi.check(_capi.lib().depot_job_reconcile(
                self._live_handle(), ctypes.byref(step),
                ctypes.byref(rolled_back)))
        return step.value, bool(rolled_back.value)

    def roll_back(self, step: int) -> None:
        """Rolls the job back to `step` on every server: each drops the
        contributions in flight and returns to `step`, exactly at it or from
        its checkpoint of it; later checkpoints are removed.
        NotFoundError: a server has no checkpoint of `step`."""
        with self._lock:
            _capi.check(_capi.lib().depot_job_roll_back(
                self._live_handle(), step))

    def newest_checkpoint_with_worker_state(self, at: int) -> Optional[int]:
        """The newest step at or before `at` that every server holds a
        complete checkpoint of with the state of the tensors the workers
        keep (an engine's offload fraction) in every chunk; None when there
        is none (docs/checkpoints.md, "The state the workers keep")."""
        step = _capi.c_uint64()
        with self._lock:
            try:
                _capi.check(
                    _capi.lib().depot_job_newest_checkpoint_with_worker_state(
                        self._live_handle(), at, ctypes.byref(step)))
            except errors.NotFoundError:
                return None
        return step.value

    def import_checkpoint(self, step: int,
                          checkpoint_dirs: Sequence[str]) -> None:
        """Replaces the job's state on every server by the server-side
        checkpoint of `step` that the servers of a job of the same config,
        of any count, wrote into `checkpoint_dirs` (their --checkpoint_dir
        values, each readable by every server of this job; a shared
        filesystem). Every server verifies its part before any imports:
        NotFoundError (no such step), FailedPreconditionError (incomplete,
        naming the missing manifest; another config) and DataLossError (a
        damaged or missing file, named) leave every server as it was. The
        job is then at `step`: pull the weights (DepotOptimizer does)."""
        dirs = [str(d) for d in checkpoint_dirs]
        if not dirs:
            raise ValueError("import_checkpoint: no checkpoint directory")
        array = (ctypes.c_char_p * len(dirs))(*[d.encode() for d in dirs])
        with self._lock:
            _capi.check(_capi.lib().depot_job_import_checkpoint(
                self._live_handle(), step, array, len(dirs)))

    def delete(self) -> None:
        """Deletes the job on every server, freeing its state."""
        with self._lock:
            _capi.check(_capi.lib().depot_job_delete(self._live_handle()))

    def close(self) -> None:
        """Frees the handle; the job stays on the servers."""
        with self._lock:
            super().close()

    def _describe(self) -> str:
        return f"Job {self.name!r}"


# A saved state: what load_state and decode_state read in place.
StateBytes = Union[bytes, bytearray, memoryview, np.ndarray, "torch.Tensor"]


class _LibraryBuffer:
    """A buffer the library allocated, seen by NumPy through the array
    interface; depot_buffer_free frees it when the last array over it goes."""

    def __init__(self, address: int, size: int) -> None:
        self._address = address
        # Held from the start: at interpreter exit the module may be gone.
        self._free = _capi.lib().depot_buffer_free
        self.__array_interface__ = {"data": (address, False),
                                    "shape": (size,), "typestr": "|u1",
                                    "version": 3}

    def __del__(self) -> None:
        self._free(self._address)


def _library_array(call) -> np.ndarray:
    """Runs call(data, size), a C call that hands out a buffer to free with
    depot_buffer_free, and returns the buffer as a uint8 array (no copy)."""
    data = ctypes.c_void_p()
    size = ctypes.c_size_t()
    _capi.check(call(ctypes.byref(data), ctypes.byref(size)))
    return np.asarray(_LibraryBuffer(data.value, size.value))


def _byte_view(state: StateBytes, what: str) -> np.ndarray:
    """`state` as a contiguous 1-D uint8 array over the same memory: bytes-like
    objects, uint8 NumPy arrays and CPU uint8 tensors, never copied."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(state, torch.Tensor):
        if state.device.type != "cpu" or state.dtype != torch.uint8:
            raise ValueError(f"{what} is a {state.dtype} tensor on "
                             f"{state.device}: pass a CPU uint8 tensor")
        state = state.detach().numpy()
    if isinstance(state, np.ndarray):
        if state.dtype != np.uint8 or not state.flags.c_contiguous:
            raise ValueError(f"{what} must be a C-contiguous uint8 array "
                             f"(this one: {state.dtype}, contiguous: "
                             f"{state.flags.c_contiguous})")
        return state.reshape(-1)
    try:
        return np.frombuffer(memoryview(state).cast("B"), dtype=np.uint8)
    except TypeError:
        raise TypeError(f"{what} must be bytes, a uint8 NumPy array or a CPU "
                        f"uint8 tensor, not {type(state).__name__}") from None


def _buffer_dtype(buffer: Buffer) -> DType:
    """The DType of a buffer whose type the caller chooses (init_weights)."""
    dtype = getattr(buffer, "dtype", None)
    if isinstance(dtype, np.dtype):
        for candidate in DType:
            if candidate.numpy_dtype == dtype:
                return candidate
        raise ValueError(f"weights have dtype {dtype}: use float32, float16 "
                         f"or uint16 (raw bf16 bits)")
    if dtype is None:
        raise TypeError(f"weights must be a NumPy array or a torch tensor, "
                        f"not {type(buffer).__name__}")
    return parse_dtype(dtype)
