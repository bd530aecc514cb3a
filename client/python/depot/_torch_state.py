"""torch.optim's per-parameter state <-> Depot's flat state (depot.FlatState).

torch 1.13 keeps, per parameter that has had a gradient:
- Adam/AdamW: step (a float32 scalar tensor), exp_avg, exp_avg_sq, and
  max_exp_avg_sq when its group has amsgrad;
- SGD: momentum_buffer (None when its group has no momentum), no step;
- Adagrad: step and sum, for every parameter from construction on;
Depot's servers keep the same values as flat slot arrays and a step count per
tensor (Lion: exp_avg and its count).
"""

import torch

# The names of each kind's slots in Depot's slot order (depot.h,
# depot_flat_state_t).
SLOT_NAMES = {
    "adam": ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"),
    "adamw": ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"),
    "sgd": ("momentum_buffer",),
    "adagrad": ("sum",),
    "lion": ("exp_avg",),
}


def torch_param_state(kind, group, count, slot_views):
    """torch's state dict of one parameter from its Depot state: `count` its
    step count, `slot_views` its part of each slot array (shaped like the
    parameter). {} where torch keeps no state (no gradient yet)."""
    if kind == "adagrad":
        return {"step": torch.tensor(float(count)), "sum": slot_views[0]}
    if count == 0:
        return {}
    if kind == "sgd":
        buffer = slot_views[0] if group["momentum"] != 0 else None
        return {"momentum_buffer": buffer}
    state = {"step": torch.tensor(float(count))}
    names = SLOT_NAMES[kind]
    used = 3 if kind in ("adam", "adamw") and group["amsgrad"] else 2
    if kind == "lion":
        used = 1
    for name, view in zip(names[:used], slot_views):
        state[name] = view
    return state


def depot_param_state(kind, group, state, numel, slots):
    """The Depot (count, slot values) of one parameter from torch's state
    dict of it: a count and one flat float32 tensor (or None: zeros) per slot
    of the job's `slots`. ValueError when the state does not fit the group."""
    if not state:
        return 0, [None] * slots
    if kind == "sgd":
        buffer = state.get("momentum_buffer")
        if buffer is None:
            return 1, [None] * slots
        return 1, [_flat(buffer, numel, "momentum_buffer")] + [None] * (
            slots - 1)
    count = _count(state.get("step"))
    values = []
    for name in SLOT_NAMES[kind][:slots]:
        tensor = state.get(name)
        if tensor is None:
            if name == "max_exp_avg_sq" and not group["amsgrad"]:
                values.append(None)
                continue
            raise ValueError(f"the state dict's state has no {name!r} for a "
                             f"parameter of a {kind} group that needs it")
        values.append(_flat(tensor, numel, name))
    return count, values


def _count(step):
    if step is None:
        raise ValueError("the state dict's state has no 'step'")
    value = float(step.item() if torch.is_tensor(step) else step)
    if value < 0 or value != int(value):
        raise ValueError(f"the state dict has step {value!r}, not a count")
    return int(value)


def _flat(tensor, numel, name):
    if tensor.numel() != numel:
        raise ValueError(f"the state dict's {name} has {tensor.numel()} "
                         f"elements, its parameter {numel}")
    return tensor.detach().reshape(-1).to(torch.float32)
