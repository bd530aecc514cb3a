"""DepotOptimizer's arguments: torch.optim's, per kind, with torch's defaults
and torch's own checks, mapped onto Depot's job config.

The accepted keyword arguments of each kind are read from the installed
torch.optim class's signature, so DepotOptimizer takes exactly what
torch.optim takes (a keyword torch does not know raises TypeError as torch
does) with the same defaults, and its values are checked by building that
torch.optim class on a one-element parameter (torch's own ValueError).
"""

import inspect
import math

import torch
from torch.optim.optimizer import required as _REQUIRED

# The kinds with a torch.optim class; "lion" is Depot's own.
TORCH_CLASSES = {
    "adamw": torch.optim.AdamW,
    "adam": torch.optim.Adam,
    "sgd": torch.optim.SGD,
    "adagrad": torch.optim.Adagrad,
}
KINDS = tuple(TORCH_CLASSES) + ("lion",)
# Lion (Chen et al. 2023) has no torch.optim class: its arguments and the
# defaults of the paper's reference implementation.
_LION_DEFAULTS = dict(lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0,
                      maximize=False)

# Arguments that choose torch's implementation, not the update's math. The
# servers compute torch's single-tensor formula whatever they say, so they
# are accepted where torch accepts them (and rejected where torch would
# reject them on this device); differentiable=True cannot be honoured.
IMPLEMENTATION_FLAGS = ("foreach", "fused", "capturable", "differentiable")

# Per kind: the group hyperparameters that are part of the job's config, so
# fixed for the run (a change raises ValueError), with their Depot
# OptimizerConfig fields. lr and weight_decay travel with every step and may
# change (schedulers); Adagrad's initial_accumulator_value is used as torch
# uses it (the constructor's value, for every parameter).
_FIXED = {
    "adam": ("betas", "eps", "amsgrad", "maximize"),
    "adamw": ("betas", "eps", "amsgrad", "maximize"),
    "sgd": ("momentum", "dampening", "nesterov", "maximize"),
    "adagrad": ("lr_decay", "eps", "maximize"),
    "lion": ("betas", "maximize"),
}


def kind_defaults(kind):
    """torch.optim's defaults of `kind` by argument name (torch's `required`
    sentinel for SGD's lr)."""
    if kind == "lion":
        return dict(_LION_DEFAULTS)
    signature = inspect.signature(TORCH_CLASSES[kind].__init__)
    return {name: p.default for name, p in signature.parameters.items()
            if name not in ("self", "params")}


def check_hparams(kind, hparams):
    """Raises as torch.optim would for these constructor arguments: TypeError
    for an argument the kind does not take, torch's ValueError for a bad
    value, torch's error for an implementation flag this device cannot use;
    and ValueError for differentiable=True, which Depot cannot honour."""
    defaults = kind_defaults(kind)
    unknown = sorted(set(hparams) - set(defaults))
    if unknown:
        raise TypeError(
            f"DepotOptimizer(optimizer={kind!r}) got unexpected keyword "
            f"argument(s) {', '.join(unknown)}: it takes "
            f"{', '.join(sorted(defaults))} (as torch.optim"
            f"{'' if kind == 'lion' else '.' + TORCH_CLASSES[kind].__name__})")
    if hparams.get("differentiable"):
        raise ValueError(
            "differentiable=True is not supported: the optimizer step runs "
            "on the Depot servers, where autograd cannot follow it")
    if kind == "lion":
        betas = hparams.get("betas", _LION_DEFAULTS["betas"])
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"Invalid beta parameters: {betas}")
        return
    # torch's own checks, on a parameter like the model's (CPU, fp32), and
    # one step so that flags torch checks only when stepping (capturable on a
    # CPU tensor) fail here with torch's message.
    probe = torch.zeros(1, requires_grad=True)
    probe_hparams = dict(hparams)
    if defaults.get("lr") is _REQUIRED:
        # SGD's lr may come from every param group instead; the groups are
        # checked by torch's add_param_group itself.
        probe_hparams.setdefault("lr", 0.0)
    torch_optimizer = TORCH_CLASSES[kind]([probe], **probe_hparams)
    probe.grad = torch.zeros(1)
    torch_optimizer.step()


def fixed_hparams(kind, group):
    """The fixed hyperparameters of a param group (see _FIXED), normalised
    for comparison (betas as a tuple of floats)."""
    values = {}
    for name in _FIXED[kind]:
        value = group[name]
        values[name] = (tuple(float(b) for b in value) if name == "betas"
                        else value)
    return values


def check_fixed(kind, expected, groups, *, what="param group"):
    """ValueError unless every group of `groups` keeps the fixed
    hyperparameters in `expected` (one dict per group, fixed_hparams)."""
    for index, (want, group) in enumerate(zip(expected, groups)):
        have = fixed_hparams(kind, group)
        for name, value in want.items():
            if have[name] != value:
                raise ValueError(
                    f"{what} {index} has {name}={have[name]!r}, the Depot job "
                    f"was built with {value!r}: {', '.join(_FIXED[kind])} are "
                    f"part of the job's config and fixed for the run (only "
                    f"lr and weight_decay may change between steps); build a "
                    f"DepotOptimizer with the new values and a new job_name")


def depot_fields(kind, group, initial_accumulator_value):
    """The Depot OptimizerConfig fields (depot/job_config.h) of a param
    group's hyperparameters."""
    fields = dict(lr=float(group["lr"]),
                  weight_decay=float(group["weight_decay"]),
                  maximize=bool(group["maximize"]))
    if kind in ("adam", "adamw"):
        beta1, beta2 = group["betas"]
        fields.update(adam_beta1=float(beta1), adam_beta2=float(beta2),
                      adam_eps=float(group["eps"]),
                      amsgrad=bool(group["amsgrad"]))
    elif kind == "sgd":
        fields.update(sgd_momentum=float(group["momentum"]),
                      sgd_dampening=float(group["dampening"]),
                      sgd_nesterov=bool(group["nesterov"]))
    elif kind == "adagrad":
        fields.update(adagrad_lr_decay=float(group["lr_decay"]),
                      adagrad_eps=float(group["eps"]),
                      adagrad_initial_accumulator_value=float(
                          initial_accumulator_value))
    else:
        beta1, beta2 = group["betas"]
        fields.update(lion_beta1=float(beta1), lion_beta2=float(beta2))
    return fields


# Loss scaling presets: torch.cuda.amp.GradScaler's defaults (init_scale
# 2**16, growth and backoff 2 and 0.5, growth_interval 2000, no hysteresis;
# torch has no floor, so the floor is fp32's smallest normal) and Megatron's
# DynamicGradScaler defaults.
LOSS_SCALE_PRESETS = {
    "dynamic": dict(initial_loss_scale=2.0 ** 16, min_loss_scale=2.0 ** -126,
                    loss_scale_window=2000, hysteresis=1),
    "megatron": dict(initial_loss_scale=2.0 ** 32, min_loss_scale=1.0,
                     loss_scale_window=1000, hysteresis=2),
}
LOSS_SCALE_FIELDS = ("initial_loss_scale", "min_loss_scale",
                     "loss_scale_window", "hysteresis")


def scaling_fields(clip_grad, clip_grad_norm_type, loss_scale, **dynamic):
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
    elif isinstance(loss_scale, str) and loss_scale in LOSS_SCALE_PRESETS:
        fields["loss_scale"] = 0.0  # Megatron: 0 with fp16 asks for dynamic
        fields.update(LOSS_SCALE_PRESETS[loss_scale])
        fields.update({k: v for k, v in dynamic.items() if v is not None})
    elif (isinstance(loss_scale, (int, float))
          and not isinstance(loss_scale, bool) and loss_scale > 0
          and math.isfinite(loss_scale)):
        fields["loss_scale"] = float(loss_scale)
    else:
        raise ValueError(f'loss_scale must be None, "dynamic" (torch '
                         f'GradScaler\'s defaults), "megatron" (Megatron\'s) '
                         f"or a number > 0, not {loss_scale!r}")
    if fields["loss_scale"] != 0.0 and any(v is not None
                                           for v in dynamic.values()):
        raise ValueError(f"{', '.join(LOSS_SCALE_FIELDS)} apply to "
                         f'loss_scale="dynamic" or "megatron" only')
    return fields
