"""depot.Engine: a GPU worker's transfer engine (docs/gpu.md) from Python.

The engine owns two flat buffers over a job's index space, on the device:
the gradients, which backward writes, and the weights, which forward reads.
Each bucket (whole chunks) of gradients leaves as soon as it is complete, and
its updated weights come back into the weights buffer:

    engine = depot.Engine(job, device="cuda")          # or "host"
    engine.begin_step(step, group_hparams=..., loss_scale=...)
    ... backward; when bucket b's gradients are complete on `stream`:
    engine.gradients_ready(b, stream)                   # never blocks
    result = engine.finish_step()
    ... before forward reads bucket b's weights:
    engine.wait_weights(b, stream)

`stream` is a cudaStream_t as an int (torch.cuda.current_stream().cuda_stream)
for a CUDA engine, and ignored by a host engine ("host": device memory is host
memory; for tests and CPU trainers), where the calling thread is the stream.
depot.torch.DepotOptimizer drives one for CUDA parameters; this class is the
layer below it.
"""

from __future__ import annotations

import ctypes
import dataclasses
from typing import Iterable, List, Optional, Tuple

from depot import _capi
from depot._handle import OwnedHandle
from depot.client import Job, StepResult, _step_result

DEVICES = {"host": 0, "cuda": 1}


@dataclasses.dataclass(frozen=True)
class CaptureReport:
    """A send of the kept state into the servers' checkpoint captures of
    `step` (0: nothing to report): the chunks sent, and why the rest could
    not be ("" when none failed)."""

    step: int
    chunks: int
    error: str


def unique_id(device: str = "cuda") -> bytes:
    """A new id for a node of several local ranks (128 bytes): make it on
    one rank and pass it to every rank's Engine(unique_id=...). On CUDA it
    is NCCL's unique id; on the host it names a node of threads of this
    process."""
    kind = _device_kind(device)
    out = (ctypes.c_uint8 * 128)()
    _capi.check(_capi.lib().depot_engine_unique_id(kind, out))
    return bytes(out)


def _device_kind(device: str) -> int:
    if device not in DEVICES:
        raise ValueError(f"device must be one of {', '.join(DEVICES)}, not "
                         f"{device!r}")
    return DEVICES[device]


class Engine(OwnedHandle):
    """The transfer engine of one local rank (depot.h, "engine").

    Args:
      job: the depot.Job (its worker is the node); must outlive the engine,
        and is not stepped otherwise while the engine exists.
      device: "cuda" or "host".
      cuda_device: the CUDA device ordinal.
      local_rank, local_ranks, unique_id: this process's place in its node
        and the node's id (depot.engine.unique_id on one rank) when
        local_ranks > 1.
      bucket_chunks: chunks per bucket, a multiple of local_ranks (None: 4
        per rank).
      d2h_slots, h2d_slots: pinned slots per ring (None: the default, 4).
      streams_per_server: Step streams per server.
      delayed_update: ZeRO-Offload's delayed parameter update (docs/gpu.md).
      offload_fraction: share of the parameters whose optimizer runs on the
        servers; the rest runs on this device.
      host_copy_bytes_per_second: host engine only: throttle the copies as a
        PCIe link of that bandwidth (tests).
      collective_timeout_s: local_ranks > 1: how long one of the node's
        collectives may wait for the other local ranks (None: the default,
        600 s; 0: no limit). Past it, or when another rank's collectives
        failed, this rank's are aborted: the step fails
        (DeadlineExceededError, or FailedPreconditionError for another
        rank's failure), and so does every later begin_step and
        check_node: make every rank's engine anew (docs/gpu.md, "A rank
        that dies"). Keep it above the client's step timeout.
    """

    _DESTROY = "depot_engine_destroy"

    def __init__(self, job: Job, device: str = "cuda", *, cuda_device: int = 0,
                 local_rank: int = 0, local_ranks: int = 1,
                 unique_id: Optional[bytes] = None,
                 bucket_chunks: Optional[int] = None,
                 d2h_slots: Optional[int] = None,
                 h2d_slots: Optional[int] = None,
                 streams_per_server: Optional[int] = None,
                 delayed_update: bool = False, offload_fraction: float = 1.0,
                 host_copy_bytes_per_second: float = 0.0,
                 collective_timeout_s: Optional[float] = None):
        lib = _capi.lib()
        options = _capi.EngineOptions()
        lib.depot_engine_options_init(ctypes.byref(options))
        options.device = _device_kind(device)
        options.cuda_device = cuda_device
        options.local_rank = local_rank
        options.local_ranks = local_ranks
        if unique_id is not None:
            if len(unique_id) != 128:
                raise ValueError(f"unique_id has {len(unique_id)} bytes, not "
                                 f"128 (make it with depot.engine.unique_id)")
            ctypes.memmove(options.unique_id, unique_id, 128)
        elif local_ranks > 1:
            raise ValueError("a node of several local ranks needs the "
                             "node's unique_id (depot.engine.unique_id on "
                             "one rank, passed to all)")
        if bucket_chunks is not None:
            options.bucket_chunks = bucket_chunks
        if d2h_slots is not None:
            options.d2h_slots = d2h_slots
        if h2d_slots is not None:
            options.h2d_slots = h2d_slots
        if streams_per_server is not None:
            options.streams_per_server = streams_per_server
        options.delayed_update = int(bool(delayed_update))
        options.offload_fraction = offload_fraction
        options.host_copy_bytes_per_second = host_copy_bytes_per_second
        if collective_timeout_s is not None:
            options.collective_timeout_seconds = collective_timeout_s
        handle = ctypes.c_void_p()
        _capi.check(lib.depot_engine_create(
            job._live_handle(), ctypes.byref(options), ctypes.byref(handle)))
        self._handle = handle.value
        self.job = job  # kept alive with the engine
        self.device = device
        self.delayed_update = bool(delayed_update)
        self.padded_elems: int = lib.depot_engine_padded_elems(self._handle)
        self.num_buckets: int = lib.depot_engine_num_buckets(self._handle)
        self.pinned_bytes: int = lib.depot_engine_pinned_bytes(self._handle)
        count = lib.depot_engine_device_tensors(self._handle, None, 0)
        tensors = (_capi.c_uint32 * count)()
        lib.depot_engine_device_tensors(self._handle, tensors, count)
        self.device_tensors: List[int] = list(tensors)
        self.bucket_ranges: List[Tuple[int, int]] = []
        for b in range(self.num_buckets):
            begin, end = _capi.c_uint64(), _capi.c_uint64()
            _capi.check(lib.depot_engine_bucket_range(
                self._handle, b, ctypes.byref(begin), ctypes.byref(end)))
            self.bucket_ranges.append((begin.value, end.value))

    def _describe(self) -> str:
        return "the depot.Engine"

    # The buffers' addresses (device pointers on CUDA).
    def grads_address(self, step: Optional[int] = None) -> int:
        """The gradient buffer of the step begun last, or of `step`."""
        lib = _capi.lib()
        if step is None:
            return lib.depot_engine_grads(self._live_handle())
        return lib.depot_engine_grads_of_step(self._live_handle(), step)

    def weights_address(self) -> int:
        return _capi.lib().depot_engine_weights(self._live_handle())

    def read_device_state(self, flat) -> None:
        """Writes the optimizer state of the tensors kept on the node's
        devices (device_tensors: their master weights, slots and step
        counts), which the servers' state does not hold, over `flat` (a
        depot.FlatState of the whole job, as Job.decode_state returns),
        leaving its other values as they are. With several local ranks
        each holds its own chunks' part and this is a collective of the
        node: every local rank calls it between the same two steps (one
        that does not leaves the others waiting), and each gets it all."""
        c_state = self.job._c_flat_state(flat)
        _capi.check(_capi.lib().depot_engine_read_device_state(
            self._live_handle(), ctypes.byref(c_state)))

    def write_device_state(self, flat) -> None:
        """Loads the kept tensors' state from `flat` onto the device (with
        the servers' state of the same FlatState: Job.load_state); each
        local rank loads its own chunks' part (not a collective)."""
        c_state = self.job._c_flat_state(flat)
        _capi.check(_capi.lib().depot_engine_write_device_state(
            self._live_handle(), ctypes.byref(c_state)))

    def store_device_state(self) -> None:
        """Writes this rank's part of the kept tensors' state into the
        servers' own arrays, at the servers' step, so that a checkpoint
        they take next (Job.checkpoint) holds the whole state. With several
        local ranks it is a collective of the node: every rank stores its
        own part, and it returns once every rank has (depot.AbortedError
        when another rank could not); then one rank takes the checkpoint.
        depot.FailedPreconditionError: a step in flight, the state missing
        (resume=True before a load) or lost (a failed step), or the servers
        at another step."""
        _capi.check(_capi.lib().depot_engine_store_device_state(
            self._live_handle()))

    def restore_device_state(self) -> None:
        """Reads this rank's part of the kept tensors' state back from the
        servers' arrays onto the device: after the servers went back to a
        checkpoint that holds it (one taken after store_device_state, or a
        periodic one the engine filled: Job.newest_checkpoint_with_worker_
        state), or while they are at the step it was stored at.
        depot.FailedPreconditionError when a chunk of the servers' does not
        hold it (steps the servers only summed ran since). With several
        local ranks it is a collective of the node: depot.AbortedError on a
        rank whose own part came back while another's did not (its state
        is then missing again)."""
        _capi.check(_capi.lib().depot_engine_restore_device_state(
            self._live_handle()))

    def begin_step(self, step: int, *, group_hparams: Iterable = (),
                   loss_scale: float = 1.0, known_commit=None,
                   no_grad_tensors: Iterable[int] = ()) -> None:
        """Starts step `step` (options as depot.Job.step; no weight
        overrides)."""
        options, keep = self.job._step_options(
            group_hparams, loss_scale, known_commit, no_grad_tensors, ())
        _capi.check(_capi.lib().depot_engine_begin_step(
            self._live_handle(), step, ctypes.byref(options)))
        del keep

    def gradients_ready(self, bucket: int, stream: int = 0) -> None:
        _capi.check(_capi.lib().depot_engine_gradients_ready(
            self._live_handle(), bucket, stream))

    def wait_weights(self, bucket: int, stream: int = 0) -> None:
        _capi.check(_capi.lib().depot_engine_wait_weights(
            self._live_handle(), bucket, stream))

    def finish_step(self) -> StepResult:
        result = _capi.StepResult()
        _capi.check(_capi.lib().depot_engine_finish_step(
            self._live_handle(), ctypes.byref(result)))
        return _step_result(result)

    def wait_captures(self) -> CaptureReport:
        """With an offload fraction, finish_step has the kept state of a
        step the servers capture for a checkpoint sent into the captures in
        the background (it waits only for the send before, and reports one
        that has ended: StepResult.capture_step). This waits for a send
        still under way and returns what no finish_step reported yet.
        store_device_state, and finish_step of a failed step, wait too; call
        it before checkpointing, rolling back or loading the job by hand
        between steps."""
        report = _capi.CaptureReport()
        _capi.check(_capi.lib().depot_engine_wait_captures(
            self._live_handle(), ctypes.byref(report)))
        return CaptureReport(report.step, report.chunks,
                             report.error.decode(errors="replace"))

    def check_node(self) -> None:
        """A node of several local ranks: the node's verdict on the steps
        finish_step returned here without an error (each read once).
        depot.AbortedError naming a step that failed on another local rank:
        this rank's weights are then not the servers', and every rank
        recovers as from a failed step. Waits for the device to reach it;
        begin_step checks too. One local rank: nothing."""
        _capi.check(_capi.lib().depot_engine_check_node(self._live_handle()))

    def synchronize_node(self) -> None:
        """A node of several local ranks: returns once every rank's engine
        has called it (an all-reduce on the node's collective). After a
        failed step each rank reconciles the job; this keeps every rank's
        next step from reaching the servers before the last rank's
        reconcile is over. depot.FailedPreconditionError with a step in
        flight or the node's collectives aborted;
        depot.DeadlineExceededError when another rank did not come within
        the collective timeout. One local rank: nothing."""
        _capi.check(
            _capi.lib().depot_engine_synchronize_node(self._live_handle()))

    def agree_on_step(self, step: int) -> int:
        """synchronize_node, which also returns the least `step` any local
        rank passed: what the ranks agree on when each found a step of its
        own that may differ. One local rank: `step`."""
        agreed = _capi.c_uint64()
        _capi.check(_capi.lib().depot_engine_agree_on_step(
            self._live_handle(), step, ctypes.byref(agreed)))
        return agreed.value
