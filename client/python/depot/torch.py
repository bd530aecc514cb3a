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

What runs where: the fp32 master weights and the moments live on the servers,
which apply torch.optim's update (docs/optimizers.md); step() packs every
parameter's .grad into one flat host buffer, sends it with each param group's
current lr and weight_decay (so lr schedulers work), and copies the updated
weights into the parameters in place.

Several data-parallel workers (num_workers = W > 1): every worker builds the
same model with the same initial values and the same param groups, and
constructs the optimizer with the same job_name and its own worker_rank. The
servers SUM the W workers' gradients. To train on the mean loss over the
global batch, each worker divides its loss by W when that loss is a mean over
its local part of the batch (equal parts): loss = local_mean_loss / W.

Differences from torch.optim, all checked rather than ignored:
- one optimizer config per job: param groups may differ in lr and
  weight_decay only (betas, eps, momentum, dampening, nesterov are the same
  for every group and fixed for the run; a change raises ValueError);
- the layout is fixed at construction: parameters with requires_grad=False
  are left out (never updated, as in torch); add_param_group afterwards
  raises NotImplementedError;
- a parameter whose .grad is None is sent as a zero gradient: torch would
  skip it, Depot still applies weight decay and the moments' decay to it;
- state_dict() holds torch's usual "state" (empty) and "param_groups",
  plus the servers' whole optimizer state as bytes under "depot_state" and
  the last applied step under "depot_step"; load_state_dict() loads that
  state into this optimizer's job (which may have another job_name) instead
  of initialising it from the parameters. Restore the model's own
  state_dict too: it holds the low-precision weights. Take both between
  steps, on one worker. Every worker loads the same dict (loading the same
  state twice is harmless), and all must have loaded before any steps
  again (a barrier): a load while a peer's step is pending is refused with
  FailedPreconditionError. The loss scaler's state (Megatron's scale and
  trackers) travels under "depot_grad_scaler", so a resumed fp16 run keeps
  its scale.
"""

import dataclasses
import math

import torch

import depot
from depot.buffers import DType, parse_dtype

_ADAM_HPARAMS = ("betas", "eps")
_SGD_HPARAMS = ("momentum", "dampening", "nesterov")
_TORCH_DTYPES = {DType.FP32: torch.float32, DType.BF16: torch.bfloat16,
                 DType.FP16: torch.float16}
_DEFAULT_WEIGHT_DECAY = {"adamw": 1e-2, "adam": 0.0, "sgd": 0.0}
# DepotOptimizer.state_dict's keys for the servers' state and its step.
_STATE_KEY = "depot_state"
_STEP_KEY = "depot_step"
_SCALER_KEY = "depot_grad_scaler"
# Megatron's loss-scaling config fields DepotOptimizer passes through.
_LOSS_SCALE_FIELDS = ("initial_loss_scale", "min_loss_scale",
                      "loss_scale_window", "hysteresis")


@dataclasses.dataclass(frozen=True)
class LastStep:
    """What the servers decided on the last step (DepotOptimizer.last_step).

    grad_norm: the unscaled gradient's norm over the whole model (0 unless
      the step measured it: clip_grad > 0 or dynamic loss scaling);
    clip_coef: the factor applied to the gradient (1 = not clipped);
    found_inf: the gradient held a NaN or Inf; skipped: the step changed no
      parameter (as Megatron, a found_inf step is skipped);
    loss_scale: the scale the step's gradients were divided by.
    """

    grad_norm: float
    clip_coef: float
    found_inf: bool
    skipped: bool
    loss_scale: float


class DepotOptimizer(torch.optim.Optimizer):
    """AdamW, Adam or SGD with torch.optim's semantics, run by Depot servers.

    Args:
      params: parameters or param groups (dicts), as for torch.optim.
      servers: "host:port" of every Depot server, in the same order on every
        worker.
      job_name: the Depot job; every worker of a run passes the same one, and
        a new run needs a new one (or the old job deleted).
      optimizer: "adamw" (default), "adam" or "sgd".
      lr, weight_decay: defaults of the groups (weight_decay defaults to
        torch's: 1e-2 for AdamW, 0 for Adam and SGD).
      betas, eps: Adam and AdamW. momentum, dampening, nesterov: SGD.
      num_workers, worker_rank: data-parallel workers sharing the job.
      grad_dtype, weight_dtype: "fp32", "bf16" or "fp16" on the wire; by
        default the parameters' dtype when they all share one, else fp32.
      chunk_elems: Depot's pipeline chunk (elements); None: the default.
      clip_grad: > 0 clips the global gradient norm to it as
        torch.nn.utils.clip_grad_norm_ would (the servers measure the norm
        over every worker's summed gradient); 0: no clipping.
      clip_grad_norm_type: 2 or math.inf ("l2" / "inf").
      loss_scale: None: no loss scaling; a number: a constant scale;
        "dynamic": Megatron's dynamic scaler (fp16 gradients only), set up by
        initial_loss_scale, min_loss_scale, loss_scale_window, hysteresis
        (None: Megatron's defaults 2**32, 1, 1000, 2). Multiply the loss by
        opt.loss_scale (or call opt.scale_loss(loss)) before backward.
      client: a depot.Client to use instead of connecting to `servers`.
      wait_timeout: seconds to wait for the servers to be up.
    """

    def __init__(self, params, servers=None, *, job_name, optimizer="adamw",
                 lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=None,
                 momentum=0.0, dampening=0.0, nesterov=False, num_workers=1,
                 worker_rank=0, grad_dtype=None, weight_dtype=None,
                 chunk_elems=None, clip_grad=0.0, clip_grad_norm_type=2,
                 loss_scale=None, initial_loss_scale=None,
                 min_loss_scale=None, loss_scale_window=None, hysteresis=None,
                 client=None, wait_timeout=60.0):
        scaling = _scaling_fields(clip_grad, clip_grad_norm_type, loss_scale,
                                  initial_loss_scale=initial_loss_scale,
                                  min_loss_scale=min_loss_scale,
                                  loss_scale_window=loss_scale_window,
                                  hysteresis=hysteresis)
        self._kind = optimizer.lower()
        if self._kind not in _DEFAULT_WEIGHT_DECAY:
            raise ValueError(f"optimizer must be 'adamw', 'adam' or 'sgd', "
                             f"not {optimizer!r}")
        if weight_decay is None:
            weight_decay = _DEFAULT_WEIGHT_DECAY[self._kind]
        defaults = dict(lr=lr, weight_decay=weight_decay)
        if self._kind == "sgd":
            defaults.update(momentum=momentum, dampening=dampening,
                            nesterov=nesterov)
        else:
            defaults.update(betas=tuple(betas), eps=eps)
        self._job = None
        super().__init__(params, defaults)
        self._job_hparams = {k: defaults[k] for k in self._fixed_hparams()}
        self._check_fixed_hparams()
        if client is None:
            if servers is None:
                raise TypeError("DepotOptimizer needs servers= or client=")
            client = depot.Client(servers)
        client.wait_for_servers(wait_timeout)
        self._client = client
        self._open_job(job_name, num_workers, worker_rank, grad_dtype,
                       weight_dtype, chunk_elems, scaling)
        self._scaler = depot.GradScaler(self._job)
        self._depot_step = 0  # the last step the servers applied
        self._initialized = False
        self.last_result = None  # the depot.StepResult of the last step
        self.last_step = None  # its LastStep

    # -- layout and job -------------------------------------------------

    def _fixed_hparams(self):
        return _SGD_HPARAMS if self._kind == "sgd" else _ADAM_HPARAMS

    def _open_job(self, job_name, num_workers, worker_rank, grad_dtype,
                  weight_dtype, chunk_elems, scaling):
        # One tensor per trainable parameter, in param-group order. Depot's
        # groups are the torch groups that hold trainable parameters,
        # numbered densely: _torch_groups[depot_group] is the torch index.
        tensors, self._params, self._torch_groups = [], [], []
        for torch_group, group in enumerate(self.param_groups):
            params = [p for p in group["params"] if p.requires_grad]
            if params:
                self._torch_groups.append(torch_group)
            for p in params:
                tensors.append((f"param{len(tensors)}", p.numel(),
                                len(self._torch_groups) - 1))
                self._params.append(p)
        if not tensors:
            raise ValueError("DepotOptimizer got no parameter that requires "
                             "grad")
        model_dtype = _common_dtype(self._params)
        self._grad_dtype = parse_dtype(grad_dtype or model_dtype)
        self._weight_dtype = parse_dtype(weight_dtype or model_dtype)
        if scaling["loss_scale"] == 0 and self._grad_dtype != DType.FP16:
            raise ValueError(
                f'loss_scale="dynamic" needs fp16 gradients, not '
                f"{self._grad_dtype.name.lower()}: pass grad_dtype=\"fp16\", "
                f"or a constant loss_scale")
        fields = dict(lr=self.defaults["lr"],
                      weight_decay=self.defaults["weight_decay"], **scaling)
        if self._kind == "sgd":
            fields.update(sgd_momentum=self.defaults["momentum"],
                          sgd_dampening=self.defaults["dampening"],
                          sgd_nesterov=self.defaults["nesterov"])
        else:
            beta1, beta2 = self.defaults["betas"]
            fields.update(adam_beta1=beta1, adam_beta2=beta2,
                          adam_eps=self.defaults["eps"])
        self._job = self._client.open_job(
            job_name, tensors, worker_rank=worker_rank,
            num_workers=num_workers, optimizer=self._kind,
            grad_dtype=self._grad_dtype, weight_dtype=self._weight_dtype,
            chunk_elems=chunk_elems, **fields)
        self._slots = [(p, offset, p.numel()) for p, offset in
                       zip(self._params, self._job.tensor_offsets)]
        n = self._job.total_elems
        self._grads = torch.zeros(n, dtype=_TORCH_DTYPES[self._grad_dtype])
        self._weights = torch.zeros(n,
                                    dtype=_TORCH_DTYPES[self._weight_dtype])

    @property
    def loss_scale(self):
        """The scale to multiply this step's loss by (1 without scaling)."""
        return self._scaler.scale

    def scale_loss(self, loss):
        """loss * loss_scale, to call backward on."""
        return loss * self.loss_scale

    @property
    def job(self):
        """The depot.Job (status, pull, delete)."""
        return self._job

    def add_param_group(self, param_group):
        if self._job is not None:
            raise NotImplementedError(
                "DepotOptimizer: the job's layout is fixed when the optimizer "
                "is built; pass every param group to the constructor")
        super().add_param_group(param_group)

    def _check_fixed_hparams(self, groups=None):
        """ValueError unless `groups` (default: param_groups) keep the job's
        fixed hyperparameters."""
        groups = self.param_groups if groups is None else groups
        for index, group in enumerate(groups):
            for key, value in self._job_hparams.items():
                have = group[key]
                if (tuple(have) if key == "betas" else have) != value:
                    raise ValueError(
                        f"param group {index} has {key}={have!r}, the job "
                        f"has {value!r}: Depot runs one optimizer config per "
                        f"job, so only lr and weight_decay may differ between "
                        f"groups or change during training")

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
            for status in self._job.status():
                if status.step > 0:
                    raise depot.FailedPreconditionError(
                        f'job "{self._job.name}" has already been trained '
                        f"to step {status.step} on {status.server}; "
                        f"DepotOptimizer starts a job at step 1: use another "
                        f"job_name, or delete the job") from None
        self._initialized = True

    def _group_hparams(self):
        """This step's (depot group, lr, weight_decay) of every group."""
        return [(depot_group, float(self.param_groups[torch_group]["lr"]),
                 float(self.param_groups[torch_group]["weight_decay"]))
                for depot_group, torch_group in enumerate(self._torch_groups)]

    @torch.no_grad()
    def step(self, closure=None):
        """Sends every parameter's .grad, with each group's current lr and
        weight_decay, and writes the updated weights into the parameters.
        Returns the closure's loss (None without a closure)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._check_fixed_hparams()
        if not self._initialized:
            self._init_weights()
        for p, offset, numel in self._slots:
            view = self._grads[offset:offset + numel]
            if p.grad is None:
                view.zero_()
            elif p.grad.is_sparse:
                raise RuntimeError("DepotOptimizer does not support sparse "
                                   "gradients")
            else:
                view.copy_(p.grad.reshape(-1))
        step = self._depot_step + 1
        loss_scale = self.loss_scale
        result = self._job.step(step, self._grads, self._weights,
                                group_hparams=self._group_hparams(),
                                loss_scale=loss_scale)
        self._scaler.update(result.found_inf)
        self.last_result = result
        self.last_step = LastStep(
            grad_norm=result.grad_norm, clip_coef=result.clip_coef,
            found_inf=result.found_inf, skipped=result.skipped,
            loss_scale=loss_scale)
        self._depot_step = step
        for p, offset, numel in self._slots:
            p.copy_(self._weights[offset:offset + numel].view_as(p))
        return loss

    # -- checkpoints ----------------------------------------------------

    def state_dict(self):
        """torch's state dict plus the servers' state (module docstring):
        "depot_state" is None before the first step (the job is not
        initialised yet)."""
        state = super().state_dict()
        state[_STATE_KEY] = (self._job.save_state() if self._initialized
                             else None)
        state[_STEP_KEY] = self._depot_step
        state[_SCALER_KEY] = self._scaler.state_dict()
        return state

    def load_state_dict(self, state_dict):
        """Restores param_groups as torch does and replaces the job's state
        by state_dict["depot_state"]; the next step() is the saved step + 1.
        KeyError without the Depot keys (a plain torch.optim state dict);
        depot.FailedPreconditionError if the state is of another job
        config; depot.DataLossError if it is corrupt."""
        depot_keys = (_STATE_KEY, _STEP_KEY, _SCALER_KEY)
        missing = [k for k in depot_keys if k not in state_dict]
        if missing:
            raise KeyError(f"DepotOptimizer.load_state_dict: the state dict "
                           f"has no {', '.join(missing)}: it was not made by "
                           f"DepotOptimizer.state_dict")
        blob = state_dict[_STATE_KEY]
        torch_state = {k: v for k, v in state_dict.items()
                       if k not in depot_keys}
        # Checked before anything changes: torch's load_state_dict checks the
        # groups, the servers check the blob.
        self._check_fixed_hparams(torch_state["param_groups"])
        if blob is not None:
            self._job.load_state(blob)
        # After the servers accepted the blob; a scaler state made by
        # state_dict() always fits the same config.
        self._scaler.load_state_dict(state_dict[_SCALER_KEY])
        super().load_state_dict(torch_state)
        self._depot_step = int(state_dict[_STEP_KEY])
        self._initialized = blob is not None


def _scaling_fields(clip_grad, clip_grad_norm_type, loss_scale, **dynamic):
    """The job config's clipping and loss-scaling fields, checked."""
    if not (clip_grad >= 0 and math.isfinite(clip_grad)):
        raise ValueError(f"clip_grad must be >= 0 and finite, not "
                         f"{clip_grad!r}")
    norm_types = {2: "l2", 2.0: "l2", "l2": "l2", math.inf: "inf",
                  "inf": "inf"}
    if clip_grad_norm_type not in norm_types:
        raise ValueError(f"clip_grad_norm_type must be 2 or math.inf, not "
                         f"{clip_grad_norm_type!r}")
    fields = dict(clip_grad=float(clip_grad),
                  clip_grad_norm_type=norm_types[clip_grad_norm_type])
    if loss_scale is None:
        fields["loss_scale"] = 1.0
    elif loss_scale == "dynamic":
        fields["loss_scale"] = 0.0  # Megatron: 0 with fp16 asks for dynamic
        fields.update({k: v for k, v in dynamic.items() if v is not None})
    elif (isinstance(loss_scale, (int, float)) and loss_scale > 0
          and math.isfinite(loss_scale)):
        fields["loss_scale"] = float(loss_scale)
    else:
        raise ValueError(f'loss_scale must be None, "dynamic" or a number '
                         f"> 0, not {loss_scale!r}")
    if loss_scale != "dynamic" and any(v is not None
                                       for v in dynamic.values()):
        raise ValueError(f"{', '.join(_LOSS_SCALE_FIELDS)} apply to "
                         f'loss_scale="dynamic" only')
    return fields


def _common_dtype(params):
    """The parameters' dtype when all share one Depot can carry, else fp32."""
    dtypes = {p.dtype for p in params}
    if len(dtypes) == 1:
        (dtype,) = dtypes
        for depot_dtype, torch_dtype in _TORCH_DTYPES.items():
            if torch_dtype == dtype:
                return depot_dtype
    return DType.FP32
