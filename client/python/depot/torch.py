"""depot.torch.DepotOptimizer: a torch.optim.Optimizer whose step runs on
Depot servers.

Switching a training loop to Depot changes only the optimizer's construction:

    from depot.torch import DepotOptimizer
    opt = DepotOptimizer(model.parameters(), servers=["10.0.0.1:50051"],
                         job_name="run3", optimizer="adamw", lr=3e-4,
                         weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup)   # works as usual
    for batch in data:
        opt.zero_grad()
        loss_fn(model(batch)).backward()
        opt.step()     # grads out, updated weights written into the params
        sched.step()

What runs where: the fp32 master weights and the optimizer state live on the
servers, which apply torch.optim's single-tensor update
(torch.optim.X(..., foreach=False); docs/optimizers.md). step() packs every
parameter's .grad into one flat host buffer, sends it with each param
group's current lr and weight_decay (so lr schedulers work), and copies the
updated weights into the parameters in place.

What is the same as torch.optim (Adam, AdamW, SGD, Adagrad; the tests
compare the weights bit for bit):
- every constructor argument of the torch.optim class, with its default and
  its own checks (the accepted keywords are read from the installed torch);
  amsgrad, maximize, betas, eps, momentum, dampening, nesterov, lr_decay per
  param group; foreach and fused choose torch's implementation and are
  accepted where torch accepts them (Depot computes the single-tensor
  formula), capturable=True raises what torch raises on a CPU tensor;
- per-parameter state: a parameter whose .grad is None is skipped entirely
  (no update, no weight decay, no moment decay, its step count unchanged),
  so zero_grad(set_to_none=True), unused branches and frozen layers behave
  as in torch. Every parameter of the groups is in the job whatever its
  requires_grad, so freezing and unfreezing behave as in torch;
- weights changed outside the optimizer (an in-place edit,
  model.load_state_dict, an EMA swap) are noticed at the next step, by
  comparing each parameter with what Depot last wrote, and become that
  tensor's master weights on the servers, its optimizer state kept (a
  warning says so once); sync_weights() sends every parameter;
- optimizer.state[p] holds torch's keys (step, exp_avg, exp_avg_sq,
  max_exp_avg_sq, momentum_buffer, sum) as tensors read from the servers;
  torch_state_dict() (or state_dict(torch_format=True)) is a state dict that
  torch.optim's load_state_dict accepts, and load_state_dict accepts one made
  by the torch.optim optimizer of the same kind, so a running torch job moves
  onto Depot mid-run (load the model's weights first: torch has no master
  copy, Depot takes the parameters' values as master weights);
- add_param_group before the first step.

What differs:
- one job per optimizer: the hyperparameters other than lr and weight_decay
  (betas, eps, amsgrad, maximize, momentum, dampening, nesterov, lr_decay)
  are part of its config and fixed once the job is opened (at the first
  step); a later change raises ValueError. add_param_group after the first
  step raises RuntimeError;
- state tensors are fp32 whatever the parameters' dtype (torch keeps them
  in the parameter's dtype), and state[p] is read from the servers, not a
  live tensor that edits would write back;
- differentiable=True is refused (ValueError); parameters must be CPU
  tensors, or CUDA tensors of one device (an engine: see below), of fp32,
  bf16 or fp16 (float64 raises TypeError); sparse gradients raise
  RuntimeError;
- the loss scaler and gradient clipping are the servers' (see below);
- Lion (optimizer="lion") is a Depot extra with no torch.optim class.

Several data-parallel workers (num_workers = W > 1): every worker builds the
same model with the same initial values and the same param groups, and
constructs the optimizer with the same job_name and its own worker_rank. The
servers SUM the W workers' gradients. To train on the mean loss over the
global batch, each worker divides its loss by W when that loss is a mean over
its local part of the batch (equal parts): loss = local_mean_loss / W. A
parameter skipped on some workers only (its .grad None there) is updated from
the others' gradients, the missing ones counting as zero (as DDP); one that
no worker has a gradient for is skipped.

CUDA parameters (docs/gpu.md, "PyTorch on GPUs"): a transfer engine moves
the gradients bucket by bucket from inside backward and the weights back into
the parameters' storage; .grad and the parameters become views into its
buffers, and the job opens at construction. engine="host" runs the same
engine on CPU parameters. Its options: delayed_update (ZeRO-Offload's DPU:
forward s sees the weights of step s - 2; call synchronize() at the end),
offload_fraction (the share of parameters whose optimizer runs on the
servers; the rest on the GPU), local_rank / local_ranks / node_id (a node of
several GPUs is one worker; node_id from depot.torch.node_id()),
bucket_chunks, find_unused_parameters (DDP's: needed when a parameter with
requires_grad may get no gradient; the step then begins at step()),
overlap_backward (False: the gradients leave at step(), for trainers that
change them after backward; a change after backward otherwise raises at
step(), as it could not be sent), and engine_options (depot.Engine's other
arguments, e.g. collective_timeout_s: how long a node's collective may wait
for a local rank that died or hangs before step() raises
DeadlineExceededError; 600 s by default). Several backwards per step
go inside `with opt.no_sync():`. close() frees the engine.

Checkpoints: state_dict() holds torch's "param_groups", an empty "state",
the servers' whole optimizer state as a uint8 tensor under "depot_state",
the last applied step under "depot_step" and the loss scaler under
"depot_grad_scaler"; load_state_dict() loads it into this optimizer's job
(which may have another job_name). For big models, state_dict(reference=True)
(or the constructor's state_dict_reference=True) has the servers write a
checkpoint to their --checkpoint_dir and holds only a reference to it under
"depot_reference" (job, fingerprint, step, servers): load_state_dict() takes
the job back to that step, also in a new process that opens the same job.
Restore the model's own state_dict too: it holds the low-precision weights.
Take both between steps, on one worker.
With offload_fraction < 1, the state of the parameters kept on the device is
the engine's, not the servers': state_dict(), state[p] and torch_state_dict()
include it (read from the device), and load_state_dict() loads it there. A
reference (and checkpoint()) first writes it into the servers' arrays, so
that their checkpoint holds it, and loading the reference reads it back;
the engine fills the servers' periodic checkpoints with it by itself (sent
behind the next steps; a send that fails warns, and that checkpoint goes
without it; synchronize() waits for the send). A
step failed by a server restart goes back by itself to the newest step
whose checkpoint holds it on every server (RolledBackError), or, without
one, raises naming load_state_dict(). resume=True on a job that has
applied steps opens it; that state died with the trainer that held it,
and it is read back from servers restored from a checkpoint that holds
it (on a node, every rank its part); otherwise step() and state_dict() raise
FailedPreconditionError until load_state_dict() loads a state saved by
value or a reference (into the same job). On a node of several local ranks each rank holds its own chunks'
part: call gather_state() on every local rank (a collective of the node),
then state_dict() on any; without it a read raises ValueError. The same
gather_state() writes each rank's part into the servers' arrays, so that
state_dict(reference=True) or checkpoint() on any rank after it holds the
whole state (ValueError without it). Every rank calls load_state_dict().
Every worker loads the same dict (loading the same state twice is harmless),
and all must have loaded before any steps again (a barrier): a load while a
peer's step is pending is refused with FailedPreconditionError.
"""

import collections
import contextlib
import dataclasses
import time
import warnings

import torch

import depot
import depot.engine
from depot import _torch_args as args
from depot._torch_checkpoint import CheckpointMixin, ServerState
from depot._torch_engine import (_EngineDriver, check_engine_params,
                                 engine_device)
from depot.buffers import DType, parse_dtype

_TORCH_DTYPES = {DType.FP32: torch.float32, DType.BF16: torch.bfloat16,
                 DType.FP16: torch.float16}
# Loss scaler states kept for rollbacks: a rollback goes back at most a
# checkpoint interval and a write (docs/checkpoints.md); a few dozen bytes each.
_SCALER_HISTORY_STEPS = 100000


@dataclasses.dataclass(frozen=True)
class LastStep:
    """What the servers decided on the last step (DepotOptimizer.last_step).

    grad_norm: the unscaled gradient's norm over the whole model (0 unless
      the step measured it: clip_grad > 0 or dynamic loss scaling);
    clip_coef: the factor applied to the gradient (1 = not clipped);
    found_inf: the gradient held a NaN or Inf; skipped: the step changed no
      parameter (as Megatron, a found_inf step is skipped);
    loss_scale: the scale the step's gradients were divided by.

    The trainer's view of the step's cost (docs/torch.md, "What a step
    costs the trainer"):
    exposed_seconds: the host time step() took (the trainer waited on Depot
      that long: sending, the servers' update, the weights back; with an
      engine, the finish of the step that completed in it);
    wire_seconds: the step's own call to the servers, start to weights
      back (Job.step's or the engine's StepResult.wall_seconds; within
      exposed_seconds without an engine);
    server_update_seconds: the servers' CPU update time, summed over them;
    bytes_sent, bytes_received: gradient and weight payload bytes.
    """

    grad_norm: float
    clip_coef: float
    found_inf: bool
    skipped: bool
    loss_scale: float
    exposed_seconds: float = 0.0
    wire_seconds: float = 0.0
    server_update_seconds: float = 0.0
    bytes_sent: int = 0
    bytes_received: int = 0


class DepotOptimizer(CheckpointMixin, torch.optim.Optimizer):
    """Adam, AdamW, SGD or Adagrad with torch.optim's semantics (and Lion),
    run by Depot servers.

    Args:
      params: parameters or param groups (dicts), as for torch.optim.
      servers: "host:port" of every Depot server, in the same order on every
        worker.
      job_name: the Depot job; every worker of a run passes the same one, and
        a new run needs a new one (or the old job deleted).
      optimizer: "adamw" (default), "adam", "sgd", "adagrad" or "lion".
      **hparams: the torch.optim class's own arguments (lr, betas, eps,
        weight_decay, amsgrad, maximize, momentum, dampening, nesterov,
        lr_decay, initial_accumulator_value, foreach, fused, capturable,
        differentiable: whatever that class takes), with its defaults.
      num_workers, worker_rank: data-parallel workers sharing the job.
      grad_dtype, weight_dtype: "fp32", "bf16" or "fp16" on the wire; by
        default the parameters' dtype when they all share one, else fp32.
      chunk_elems: Depot's pipeline chunk (elements); None: the default.
      checkpoint_every_steps: the servers checkpoint the job to their
        --checkpoint_dir every this many steps (0: their own
        --checkpoint_every_steps; docs/checkpoints.md).
      clip_grad: > 0 clips the global gradient norm to it as
        torch.nn.utils.clip_grad_norm_ would (the servers measure the norm
        over every worker's summed gradient); 0: no clipping.
      clip_grad_norm_type: 2 or math.inf ("l2" / "inf").
      loss_scale: None: no loss scaling; a number: a constant scale;
        "dynamic": a dynamic scale with torch.cuda.amp.GradScaler's defaults
        (2**16, growth 2 after 2000 clean steps, backoff 0.5, no hysteresis);
        "megatron": Megatron's DynamicGradScaler defaults (2**32, window
        1000, hysteresis 2, min 1). Either needs fp16 gradients; override
        with initial_loss_scale, min_loss_scale, loss_scale_window,
        hysteresis. Multiply the loss by opt.loss_scale (or call
        opt.scale_loss(loss)) before backward.
      step_timeout: seconds a step may take, waiting for the other workers
        included, before it fails naming them (default: the client's, 300);
        only when DepotOptimizer creates the client (else set it on
        depot.Client).
      client: a depot.Client to use instead of connecting to `servers`.
      tls_ca, tls_cert, tls_key, token, token_file: the credentials of the
        client DepotOptimizer creates (depot.Client's, docs/security.md);
        with client=, set them on that client instead.
      retain_transport_buffers: depot.Client's (opt-in, process-wide malloc
        thresholds for about a third less CPU per transfer), for the client
        DepotOptimizer creates; with client=, set it on that client.
      wait_timeout: seconds to wait for the servers to be up.
      engine: None (a transfer engine for CUDA parameters, none for CPU
        ones), "cuda", or "host" (the engine on CPU parameters).
      resume: continue the job if it already exists on the servers (after
        they restored it from their --checkpoint_dir, or when this worker
        was restarted while its peers went on): the parameters take the
        servers' weights of the oldest step they report, resumed_step says
        the step, and the trainer moves its data position there. Without it
        such a job is refused (a new run needs a new job). With
        offload_fraction < 1 the parameters kept on the device lost their
        optimizer state with the old trainer: load_state_dict() of a state
        saved by value, or of a reference, before the first step (step()
        raises until then).
      state_dict_reference: state_dict() saves a reference to a checkpoint
        the servers write (state_dict(reference=True)) rather than the
        state's bytes: for trainers that call state_dict() themselves, with
        servers started with --checkpoint_dir.
      delayed_update, offload_fraction, local_rank, local_ranks, node_id,
        bucket_chunks, find_unused_parameters, overlap_backward,
        engine_options: the engine's (module docstring; docs/gpu.md).
    """

    def __init__(self, params, servers=None, *, job_name, optimizer="adamw",
                 num_workers=1, worker_rank=0, grad_dtype=None,
                 weight_dtype=None, chunk_elems=None, clip_grad=0.0,
                 clip_grad_norm_type=2, loss_scale=None,
                 initial_loss_scale=None, min_loss_scale=None,
                 loss_scale_window=None, hysteresis=None, step_timeout=None,
                 client=None, wait_timeout=60.0, engine=None,
                 delayed_update=False, offload_fraction=1.0, local_rank=0,
                 local_ranks=1, node_id=None, bucket_chunks=None,
                 find_unused_parameters=False, overlap_backward=True,
                 engine_options=None,
                 resume=False, checkpoint_every_steps=0,
                 state_dict_reference=False, tls_ca=None, tls_cert=None,
                 tls_key=None, token=None, token_file=None,
                 retain_transport_buffers=False, **hparams):
        kind = optimizer.lower() if isinstance(optimizer, str) else optimizer
        if kind not in args.KINDS:
            raise ValueError(f"optimizer must be one of "
                             f"{', '.join(map(repr, args.KINDS))}, not "
                             f"{optimizer!r}")
        self._kind = kind
        self._resume = bool(resume)
        self._state_dict_reference = bool(state_dict_reference)
        self.resumed_step = None
        self._driver = None
        args.check_hparams(kind, hparams)
        self._scaling = args.scaling_fields(
            clip_grad, clip_grad_norm_type, loss_scale,
            initial_loss_scale=initial_loss_scale,
            min_loss_scale=min_loss_scale,
            loss_scale_window=loss_scale_window, hysteresis=hysteresis)
        defaults = {**args.kind_defaults(kind), **hparams}
        self._job = None
        super().__init__(params, defaults)
        # Adagrad initialises every parameter's sum from the constructor's
        # value, whatever a group says (torch does the same).
        self._initial_accumulator = defaults.get("initial_accumulator_value",
                                                 0.0)
        if client is None:
            if servers is None:
                raise TypeError("DepotOptimizer needs servers= or client=")
            client = depot.Client(servers, step_timeout=step_timeout,
                                  tls_ca=tls_ca, tls_cert=tls_cert,
                                  tls_key=tls_key, token=token,
                                  token_file=token_file,
                                  retain_transport_buffers=(
                                      retain_transport_buffers))
        elif step_timeout is not None:
            raise ValueError("step_timeout applies to the client "
                             "DepotOptimizer creates; pass it to "
                             "depot.Client(step_timeout=...) instead")
        elif retain_transport_buffers:
            raise ValueError("retain_transport_buffers applies to the client "
                             "DepotOptimizer creates; pass it to "
                             "depot.Client(retain_transport_buffers=True) "
                             "instead")
        elif any(value is not None for value in
                 (tls_ca, tls_cert, tls_key, token, token_file)):
            raise ValueError("credentials apply to the client DepotOptimizer "
                             "creates; pass them to depot.Client(...) "
                             "instead")
        client.wait_for_servers(wait_timeout)
        self._client = client
        self._job_args = dict(job_name=job_name, num_workers=num_workers,
                              worker_rank=worker_rank, grad_dtype=grad_dtype,
                              weight_dtype=weight_dtype,
                              chunk_elems=chunk_elems,
                              checkpoint_every_steps=checkpoint_every_steps)
        self._scaler = None
        self._depot_step = 0  # the last step the servers applied
        self._initialized = False
        self._warned_edit = False
        self._sync_all = False
        self._state_cache = None  # (step, depot.FlatState)
        # A node of several local ranks: the step at which gather_state()
        # wrote every rank's kept state into the servers' arrays.
        self._kept_stored_step = None
        # offload_fraction < 1: the steps whose checkpoint on the servers
        # holds the kept state too (a reference or checkpoint() stored it
        # first), in this run's history: a failed step goes back to the
        # newest (_torch_engine's _back_to_whole_checkpoint).
        self._whole_steps = set()
        self.state = ServerState(self)
        self.last_result = None  # the depot.StepResult of the last step
        self.last_step = None  # its LastStep
        # Engine mode, offload_fraction < 1: the last send of the kept state
        # into the servers' checkpoint captures reported (by a step or by
        # synchronize()), a depot.engine.CaptureReport; None before one.
        self.last_capture = None
        self._trainer_metrics = None  # serve_metrics()
        # step -> the loss scaler's state after it (_record_result).
        self._scaler_history = collections.OrderedDict()
        if self._scaling["loss_scale"] == 0:
            dtype = parse_dtype(grad_dtype or _common_dtype(self._all_params()))
            if dtype != DType.FP16:
                raise ValueError(
                    f"a dynamic loss scale needs fp16 gradients, not "
                    f"{dtype.name.lower()}: pass grad_dtype=\"fp16\", or a "
                    f"constant loss_scale")
        engine_kwargs = dict(engine_options or {})
        engine_kwargs.update(
            delayed_update=delayed_update, offload_fraction=offload_fraction,
            local_rank=local_rank, local_ranks=local_ranks,
            unique_id=node_id, bucket_chunks=bucket_chunks)
        self._engine_device = engine_device(self._all_params(), engine)
        if self._engine_device is None and self._resume:
            # The step to resume from is known at construction.
            self._open_job()
            self._init_weights()
        if self._engine_device is None:
            if engine_options or delayed_update or offload_fraction != 1.0 \
                    or local_ranks != 1 or node_id is not None or \
                    bucket_chunks is not None or find_unused_parameters \
                    or overlap_backward is not True:
                raise ValueError(
                    "delayed_update, offload_fraction, local_ranks, node_id, "
                    "bucket_chunks, find_unused_parameters, overlap_backward "
                    "and engine_options are the engine's: pass CUDA "
                    "parameters or engine=\"host\"")
        else:
            # The engine's buffers must exist before the first backward, so
            # the job opens now (param groups are fixed from here on).
            check_engine_params(self._all_params(), self._engine_device)
            if not isinstance(overlap_backward, bool):
                raise TypeError(f"overlap_backward must be True or False, "
                                f"not {overlap_backward!r}")
            self._open_job()
            if not self._initialized:
                self._init_weights()
            self._driver = _EngineDriver(self, self._job, self._engine_device,
                                         engine_kwargs,
                                         find_unused_parameters,
                                         overlap_backward)

    # -- layout and job -------------------------------------------------

    def _all_params(self):
        return [p for group in self.param_groups for p in group["params"]]

    def add_param_group(self, param_group):
        if getattr(self, "_job", None) is not None:
            when = ("with an engine the job opens when the optimizer is "
                    "made: pass every param group to the constructor"
                    if getattr(self, "_engine_device", None) is not None else
                    "add every param group before the first step()")
            raise RuntimeError(
                f"DepotOptimizer.add_param_group after the job was opened on "
                f"the servers: its layout is fixed from then on; {when}")
        for p in param_group["params"] if isinstance(
                param_group["params"], (list, tuple)) else []:
            _check_param(p)
        super().add_param_group(param_group)

    def _open_job(self):
        """Opens the job on the servers (at the first step, or when its
        state is read or loaded): one tensor per parameter, one Depot param
        group per torch group."""
        if self._job is not None:
            return self._job
        params = self._all_params()
        if not params:
            raise ValueError("DepotOptimizer has no parameters")
        for p in params:
            _check_param(p)
        tensors = []
        for index, group in enumerate(self.param_groups):
            for p in group["params"]:
                tensors.append((f"param{len(tensors)}", p.numel(), index))
        self._fixed = [args.fixed_hparams(self._kind, g)
                       for g in self.param_groups]
        model_dtype = _common_dtype(params)
        self._grad_dtype = parse_dtype(self._job_args["grad_dtype"]
                                       or model_dtype)
        self._weight_dtype = parse_dtype(self._job_args["weight_dtype"]
                                         or model_dtype)
        groups = [args.depot_fields(self._kind, g, self._initial_accumulator)
                  for g in self.param_groups]
        job = self._client.open_job(
            self._job_args["job_name"], tensors,
            worker_rank=self._job_args["worker_rank"],
            num_workers=self._job_args["num_workers"], optimizer=self._kind,
            grad_dtype=self._grad_dtype, weight_dtype=self._weight_dtype,
            chunk_elems=self._job_args["chunk_elems"],
            checkpoint_every_steps=self._job_args["checkpoint_every_steps"],
            group_optimizers=groups, **groups[0], **self._scaling)
        self._params = params
        self._index = {id(p): i for i, p in enumerate(params)}
        self._slots = [(p, offset, p.numel()) for p, offset in
                       zip(params, job.tensor_offsets)]
        n = job.total_elems
        if getattr(self, "_engine_device", None) is None:
            self._grads = torch.zeros(n, dtype=_TORCH_DTYPES[self._grad_dtype])
            self._weights = torch.zeros(
                n, dtype=_TORCH_DTYPES[self._weight_dtype])
        else:  # the engine's buffers instead
            if (self._grad_dtype, self._weight_dtype) != (model_dtype,) * 2:
                raise ValueError(
                    f"with an engine, the gradients and weights on the wire "
                    f"are the parameters' dtype "
                    f"({model_dtype.name.lower()}): the parameters' .grad "
                    f"and storage are views into the engine's buffers")
            self._grads = self._weights = None
        self._job = job
        return job

    @property
    def job(self):
        """The depot.Job (status, pull, delete); opens it if needed."""
        return self._open_job()

    def _grad_scaler(self):
        if self._scaler is None:
            self._scaler = depot.GradScaler(self._open_job())
        return self._scaler

    @property
    def loss_scale(self):
        """The scale to multiply this step's loss by (1 without scaling)."""
        return self._grad_scaler().scale

    def scale_loss(self, loss):
        """loss * loss_scale, to call backward on."""
        return loss * self.loss_scale

    def sync_weights(self):
        """Makes the next step send every parameter's current value as its
        master weights (keeping the optimizer state), whether or not Depot
        notices a change."""
        self._sync_all = True

    # -- the step -------------------------------------------------------

    def _init_weights(self):
        """Every worker sends the same initial weights (the same model);
        a refusal because a peer's step-1 gradient is already pending means
        the weights are in place (as InitOrJoin in train_mlp.cc)."""
        flat = torch.zeros(self._job.total_elems, dtype=torch.float32)
        for p, offset, numel in self._slots:
            flat[offset:offset + numel].copy_(p.detach().reshape(-1))
        try:
            self._job.init_weights(flat)
        except depot.FailedPreconditionError:
            statuses = self._job.status()
            oldest = min(status.step for status in statuses)
            if self._resume and oldest > 0:
                self._resume_from(oldest, statuses)
                return
            for status in statuses:
                # With resume, a job in its first step (a worker restarted in
                # it): the initial weights, the same every worker sent, are
                # the job's.
                if status.step > 0 and not self._resume:
                    raise depot.FailedPreconditionError(
                        f'job "{self._job.name}" has already been trained '
                        f"to step {status.step} on {status.server}; "
                        f"DepotOptimizer starts a job at step 1: use another "
                        f"job_name, delete the job, or pass resume=True to "
                        f"continue it") from None
        self._initialized = True

    def _resume_from(self, step, statuses):
        """resume=True: the job exists on the servers (restored from their
        checkpoints, left by an earlier run, or running while this worker
        was restarted) and `step` is the oldest step they report: the
        parameters take the servers' weights of that step, pulled at it on
        every server (a server that has gone on to step + 1, its peer
        waiting for this worker, still holds it), and the next step is
        step + 1. Servers further apart cannot be resumed."""
        self._depot_step = step
        self._initialized = True
        self.resumed_step = step
        self._state_cache = None
        weights = torch.empty(self._job.total_elems,
                              dtype=_TORCH_DTYPES[self._weight_dtype])
        try:
            self._job.pull(dtype=self._weight_dtype, out=weights, step=step)
        except depot.FailedPreconditionError as e:
            raise depot.FailedPreconditionError(
                f'job "{self._job.name}" is at different steps on its '
                f"servers ("
                + ", ".join(f"{s.server}: {s.step}" for s in statuses)
                + f"): it cannot be resumed until they agree ({e})") from None
        if self._weights is not None:
            self._weights.copy_(weights)
        with torch.no_grad():
            for p, offset, numel in self._slots:
                p.copy_(weights[offset:offset + numel].view_as(p))

    def _group_hparams(self):
        """This step's (depot group, lr, weight_decay) of every group."""
        return [(index, float(group["lr"]), float(group["weight_decay"]))
                for index, group in enumerate(self.param_groups)]

    def _edited_weights(self):
        """(tensor index, fp32 values) of each parameter whose value is not
        what Depot last wrote into it (or of every parameter after
        sync_weights())."""
        overrides, names = [], []
        for index, (p, offset, numel) in enumerate(self._slots):
            value = p.detach().reshape(-1)
            if not self._sync_all:
                written = self._weights[offset:offset + numel]
                if written.dtype != value.dtype:
                    written = written.to(value.dtype)
                if _same_bits(value, written):
                    continue
            overrides.append((index, value.to(torch.float32).contiguous()))
            names.append(index)
        if names and not self._sync_all:
            self._warn_edit(names)
        self._sync_all = False
        return overrides

    def _warn_edit(self, names):
        if self._warned_edit:
            return
        self._warned_edit = True
        warnings.warn(
            f"DepotOptimizer: parameter(s) {names[:8]}"
            f"{'...' if len(names) > 8 else ''} changed outside the "
            f"optimizer since the last step; their new values become the "
            f"master weights on the servers (optimizer state kept), as "
            f"torch.optim would continue from them. (Said once.)",
            stacklevel=4)

    @torch.no_grad()
    def step(self, closure=None):
        """Sends every parameter's .grad (a None one as absent), with each
        group's current lr and weight_decay, and writes the updated weights
        into the parameters. Returns the closure's loss (None without a
        closure).

        depot.RolledBackError (with .step): a server restarted behind the
        others and the job went back to step `e.step` on every server; the
        parameters already hold that step's weights. Reload the data
        position of step `e.step` (and any scheduler) and go on: the next
        step() is step `e.step` + 1. On a node of several local ranks every
        rank raises it with the same step, also one whose own part of the
        failed step went through (at its next step(), or synchronize());
        each rank reloads the same data position."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        recorded = self.last_step
        start = time.perf_counter()
        try:
            return self._step(loss)
        finally:
            if self.last_step is not None and self.last_step is not recorded:
                self.last_step = dataclasses.replace(
                    self.last_step,
                    exposed_seconds=time.perf_counter() - start)
                if self._trainer_metrics is not None:
                    self._trainer_metrics.record(self._depot_step,
                                                 self.last_step)

    def serve_metrics(self, address="127.0.0.1:0"):
        """Opt-in Prometheus metrics of this trainer process: serves
        /metrics at `address` ("host:port"; port 0 picks one) from a daemon
        thread, with each step's figures (LastStep) summed as counters:
        depot_trainer_steps_total, depot_trainer_exposed_seconds_total,
        depot_trainer_wire_seconds_total,
        depot_trainer_server_update_seconds_total,
        depot_trainer_sent_bytes_total, depot_trainer_received_bytes_total,
        depot_trainer_skipped_steps_total, and the gauges depot_trainer_step,
        depot_trainer_loss_scale, depot_trainer_grad_norm. Returns the
        address it listens on. Once per optimizer."""
        if self._trainer_metrics is not None:
            raise RuntimeError("DepotOptimizer.serve_metrics: already "
                               f"serving at {self._trainer_metrics.address}")
        from depot._trainer_metrics import TrainerMetrics
        self._trainer_metrics = TrainerMetrics(address,
                                              self._job_args["job_name"])
        return self._trainer_metrics.address

    def _step(self, loss):
        job = self._open_job()
        args.check_fixed(self._kind, self._fixed, self.param_groups)
        if getattr(self, "_closed", False):
            raise RuntimeError("DepotOptimizer.step() after close()")
        if self._driver is not None:
            self._driver.run_step()
            return loss
        overrides = []
        if not self._initialized:
            self._init_weights()
        else:
            overrides = self._edited_weights()
        no_grad = []
        for index, (p, offset, numel) in enumerate(self._slots):
            view = self._grads[offset:offset + numel]
            if p.grad is None:
                no_grad.append(index)
                view.zero_()
            elif p.grad.is_sparse:
                raise RuntimeError("DepotOptimizer does not support sparse "
                                   "gradients")
            else:
                view.copy_(p.grad.reshape(-1))
        step = self._depot_step + 1
        scaler = self._grad_scaler()
        loss_scale = scaler.scale
        try:
            result = job.step(step, self._grads, self._weights,
                              group_hparams=self._group_hparams(),
                              loss_scale=loss_scale, no_grad_tensors=no_grad,
                              weight_overrides=overrides)
        except depot.RolledBackError as rolled:
            self._rolled_back(rolled.step)
            raise
        self._record_result(step, result, loss_scale)
        self._write_params()
        return loss

    def _restore_scaler(self, step):
        """A rollback to `step`: the loss scaler takes its state after that
        step, as an uninterrupted run had it."""
        state = self._scaler_history.get(step)
        if state is None:
            if self._scaler is not None and self._scaling["loss_scale"] == 0:
                warnings.warn(
                    f"DepotOptimizer: the job was rolled back to step {step}, "
                    f"older than the {len(self._scaler_history)} steps of "
                    f"loss scaler states kept: the dynamic loss scale goes "
                    f"on from its current state", RuntimeWarning)
            return
        self._grad_scaler().load_state_dict(state)
        for later in [t for t in self._scaler_history if t > step]:
            del self._scaler_history[later]

    def _rolled_back(self, step):
        """The job went back to `step` under a step (a server restarted
        behind the others): the parameters take the weights of `step`, the
        loss scaler its state after `step`, and the next step() is `step`
        + 1."""
        self._restore_scaler(step)
        self._depot_step = step
        self._after_load()
        self._write_params()

    def _note_capture(self, report):
        """A send of the kept state into the servers' checkpoint captures
        ended (`report`, a depot.engine.CaptureReport; step 0: none). One
        that failed warns: the steps stand; only that checkpoint lacks the
        state kept on the device (a rollback will not choose it)."""
        if report.step == 0:
            return
        self.last_capture = report
        if report.error:
            warnings.warn(f"DepotOptimizer: step {report.step}: "
                          f"{report.error}", RuntimeWarning)

    def _record_result(self, step, result, loss_scale):
        """Step `step` finished with `result` at `loss_scale`."""
        if getattr(result, "capture_step", 0):
            self._note_capture(depot.engine.CaptureReport(
                result.capture_step, result.capture_chunks,
                result.capture_error))
        scaler = self._grad_scaler()
        scaler.update(result.found_inf)
        # The scaler's state after each step, for a rollback to it (the
        # scaler lives here, not on the servers).
        self._scaler_history[step] = scaler.state_dict()
        self._scaler_history.move_to_end(step)
        while len(self._scaler_history) > _SCALER_HISTORY_STEPS:
            self._scaler_history.popitem(last=False)
        self.last_result = result
        self.last_step = LastStep(
            grad_norm=result.grad_norm, clip_coef=result.clip_coef,
            found_inf=result.found_inf, skipped=result.skipped,
            loss_scale=loss_scale, wire_seconds=result.wall_seconds,
            server_update_seconds=result.update_seconds,
            bytes_sent=result.bytes_sent,
            bytes_received=result.bytes_received)
        self._depot_step = step
        self._state_cache = None

    # -- the engine (CUDA parameters, or engine="host") ----------------

    def no_sync(self):
        """A context in which backward only accumulates gradients (as
        DDP's no_sync): run every backward but the last of an accumulated
        step inside it. Engine mode only; a no-op context otherwise."""
        if self._driver is None:
            return contextlib.nullcontext()
        return self._driver.no_sync()

    def checkpoint(self):
        """Has the servers write the job's state to their --checkpoint_dir
        now (after finishing any step in flight: synchronize()); returns the
        step it holds. A restarted server restores it by itself. Call it on
        one worker, between steps. With offload_fraction < 1 the kept
        parameters' state is written into the servers' arrays first, so
        that the checkpoint holds the whole state; on a node of several
        local ranks gather_state() on every rank does that, before this on
        any (ValueError otherwise)."""
        self.synchronize()
        job = self._open_job()
        self._store_kept_state("checkpoint()")
        step = job.checkpoint()
        self._note_whole_step(step)
        return step

    def attach(self, model):
        """Engine mode: forward waits per bucket. Each module of `model`
        waits, before its own forward, only for the buckets that hold its
        parameters, so the first layers run while later buckets' weights
        still arrive (without it, step() waits for every bucket). Every
        parameter must be used only inside the forward of a module that
        holds it (as nn.Module code does); ValueError when some of the
        optimizer's parameters are not the model's.

        Between step() and the next forward the parameters are not yet the
        new weights (on CUDA they are being copied in on the engine's
        stream): before reading them outside a forward (an EMA of the
        weights, logging their norms) call wait_weights(). model.state_dict()
        waits by itself."""
        if self._driver is None:
            raise RuntimeError("DepotOptimizer.attach needs an engine (CUDA "
                               "parameters or engine=\"host\")")
        self._driver.attach(model)

    def wait_weights(self):
        """After step() with attach(): makes the current stream wait for the
        weights of every bucket no forward has waited for yet, so that the
        parameters can be read outside a forward (an EMA, logging, a copy).
        Without attach() step() has waited already; without an engine there
        is nothing to wait for."""
        if self._driver is not None:
            self._driver.wait_pending()

    def synchronize(self):
        """Finishes every step in flight (with the delayed update, the last
        step's weights are applied only by this) and waits for the weights.
        Called by state_dict() and load_state_dict(); call it at the end of
        training. Without an engine, nothing to do."""
        if self._driver is not None:
            self._driver.flush()

    @property
    def engine(self):
        """The depot.Engine in engine mode, else None."""
        return None if self._driver is None else self._driver.engine

    def close(self):
        """Engine mode: finishes the steps in flight, gives every parameter
        (and .grad) its own storage again and frees the engine's device and
        pinned memory. The optimizer cannot step afterwards. Stops the
        trainer metrics server (serve_metrics) in any mode. When finishing
        the steps fails (a node whose collectives were aborted), the
        parameters still get their own storage and the engine is still
        freed; then the error is raised: the parameters may not hold the
        servers' weights."""
        if self._trainer_metrics is not None:
            self._trainer_metrics.close()
            self._trainer_metrics = None
        if self._driver is None:
            return
        try:
            self._driver.flush()
        finally:
            with torch.no_grad():
                for p in self._params:
                    p.data = p.data.clone()
                    if p.grad is not None:
                        p.grad = p.grad.clone()
            self._driver.close()
            self._driver = None
            self._closed = True

    def _write_params(self):
        for p, offset, numel in self._slots:
            p.copy_(self._weights[offset:offset + numel].view_as(p))


def node_id(group=None, device="cuda"):
    """The node id every local rank of a node passes to DepotOptimizer
    (node_id=): made on the first rank of `group` (the node's ranks; None:
    the default group, for a job of one node) and broadcast to the others
    over torch.distributed, which must be initialized. On CUDA it is NCCL's
    unique id; device="host" makes one for host engines (threads of one
    process)."""
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("depot.torch.node_id needs torch.distributed "
                           "initialized (init_process_group) to send the id "
                           "to the node's ranks")
    if dist.get_rank(group) == 0:
        made = [depot.engine.unique_id(device)]
    else:
        made = [None]
    if group is None:
        source = 0
    elif hasattr(dist, "get_global_rank"):
        source = dist.get_global_rank(group, 0)
    else:  # torch < 2.0
        source = dist.distributed_c10d._get_global_rank(group, 0)
    dist.broadcast_object_list(made, src=source, group=group)
    return made[0]


def _check_param(p):
    if not isinstance(p, torch.Tensor):
        return  # torch's add_param_group says what is wrong
    if p.dtype not in _TORCH_DTYPES.values():
        raise TypeError(
            f"a parameter has dtype {p.dtype}: Depot keeps fp32 master "
            f"weights and carries fp32, bf16 or fp16 (convert the model, e.g. "
            f"model.float())")


def _same_bits(a, b):
    """a and b hold the same bits (NaNs included)."""
    if a.dtype == torch.float32:
        return torch.equal(a.view(torch.int32), b.view(torch.int32))
    return torch.equal(a.view(torch.int16), b.view(torch.int16))


def _common_dtype(params):
    """The parameters' dtype when all share one Depot can carry, else fp32."""
    dtypes = {p.dtype for p in params}
    if len(dtypes) == 1:
        (dtype,) = dtypes
        for depot_dtype, torch_dtype in _TORCH_DTYPES.items():
            if torch_dtype == dtype:
                return depot_dtype
    return DType.FP32
