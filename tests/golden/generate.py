#!/usr/bin/python3
"""Generates the golden optimizer trajectories that tests/integration/golden_test.cc
checks real depot-server processes against. See README.md beside it.

Every case trains the same three tensors (two param groups; the second, like biases
and norms, without weight decay) from the same initial weights with the same per-step
gradients for STEPS steps, with each group's learning rate (and group 0's weight
decay) changing every step, and records the weights after every step:

  - torch.optim Adam, AdamW, SGD and Adagrad in float32 on the single-tensor path
    (foreach=False), the code Depot's kernels follow operation by operation, some
    with torch's amsgrad or maximize flags. Each is
    run twice, in child processes, once with each of torch's CPU kernel sets:
      torch_default  ATEN_CPU_CAPABILITY=default: plain multiplies and adds, the
                     roundings Depot's kernels do, so the server must match bit for bit;
      torch_avx2     ATEN_CPU_CAPABILITY=avx2, what torch runs on any recent x86-64:
                     add(x, alpha=a) and addcmul become fused multiply-adds, which round
                     once where Depot rounds twice;
  - Lion in float64 from its published update rule (Chen et al. 2023, Algorithm 2),
    since torch has no Lion; its state stays float64 and only the stored weights are
    rounded to float32.

Output, in this script's directory (or the directory given as the only argument):
  manifest.json            tensors, cases, hyperparameters under Depot's
                           OptimizerConfig names, and the per-step per-group lr and
                           weight_decay (decimal doubles that read back exactly)
  inputs.f32               the initial weights (P values), then the gradients of
                           steps 1..STEPS (P values each)
  <case>.<variant>.f32     the weights after steps 1..STEPS (P values each)
All .f32 files are little-endian float32; P is the sum of the tensors' numel, and a
vector is the tensors concatenated in manifest order, without padding.

Deterministic: a second run rewrites identical files.
"""

import json
import math
import os
import re
import subprocess
import sys

import numpy as np

STEPS = 24
SEED = 20240611
HERE = os.path.dirname(os.path.abspath(__file__))

# (name, numel, param_group). Odd sizes, so that a small chunk size makes tensors
# span chunks and chunks hold padding.
TENSORS = [
    ("layer.weight", 120, 0),
    ("layer.bias", 13, 1),
    ("head.weight", 67, 0),
]
NUM_GROUPS = 2
PARAM_ELEMS = sum(numel for _, numel, _ in TENSORS)

# Child-process kernel sets: ATEN_CPU_CAPABILITY value -> what torch must report.
TORCH_KERNELS = {"default": "NO AVX", "avx2": "AVX2"}


def warmup_cosine(step_index, warmup, total, floor):
    """The lr factor of 0-based step `step_index`: linear warmup, then cosine decay
    to `floor` (the shape of a Megatron schedule)."""
    if step_index < warmup:
        return (step_index + 1) / warmup
    progress = (step_index - warmup) / max(1, total - warmup)
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


# LambdaLR lambdas, one per group: group 0 warms up then decays; group 1 warms up
# faster and steps its lr down halfway, so the groups' lrs differ at most steps.
LR_LAMBDAS = [
    lambda i: warmup_cosine(i, 4, STEPS, 0.1),
    lambda i: (0.5 if i < STEPS // 2 else 0.25) * min(1.0, (i + 1) / 2),
]


def schedule(base_lr, base_weight_decay):
    """lr[s][k] and weight_decay[s][k] of group k at step s + 1. The lr is what
    torch's LambdaLR sets (base_lr * lambda(s)); group 0's weight decay grows
    linearly, as a Megatron weight-decay increment does; group 1 has none."""
    lrs = [[base_lr * f(s) for f in LR_LAMBDAS] for s in range(STEPS)]
    wds = [[base_weight_decay * (1 + s / STEPS), 0.0] for s in range(STEPS)]
    return lrs, wds


def make_inputs():
    """Initial weights and per-step gradients, float32, from numpy's legacy
    RandomState, whose stream is frozen across numpy versions."""
    rng = np.random.RandomState(SEED)
    weights = rng.uniform(-0.5, 0.5, size=PARAM_ELEMS).astype(np.float32)
    grads = []
    for _ in range(STEPS):
        g = (rng.standard_normal(size=PARAM_ELEMS) * 0.05).astype(np.float32)
        # A few exact zeros: torch and Depot must agree on them too (Lion's sign(0)).
        g[rng.randint(0, PARAM_ELEMS, size=3)] = 0.0
        grads.append(g)
    return [weights] + grads


def split(flat):
    """The per-tensor views of a packed vector."""
    out, offset = [], 0
    for _, numel, _ in TENSORS:
        out.append(flat[offset:offset + numel])
        offset += numel
    return out


# name -> (Depot kind, base lr, base weight decay, Depot OptimizerConfig fields,
#          torch class name, torch options). Lion has no torch class.
ADAM_FIELDS = {"adam_beta1": 0.9, "adam_beta2": 0.999, "adam_eps": 1e-8}
ADAM_OPTIONS = {"betas": [0.9, 0.999], "eps": 1e-8}
AMSGRAD_FIELDS = {"adam_beta1": 0.9, "adam_beta2": 0.95, "adam_eps": 1e-8,
                  "amsgrad": True}
AMSGRAD_OPTIONS = {"betas": [0.9, 0.95], "eps": 1e-8, "amsgrad": True}
CASES = {
    "adam": ("adam", 1e-2, 0.0, ADAM_FIELDS, "Adam", ADAM_OPTIONS),
    "adam_l2": ("adam", 1e-2, 0.05, ADAM_FIELDS, "Adam", ADAM_OPTIONS),
    "adamw": ("adamw", 1e-2, 0.1, ADAM_FIELDS, "AdamW", ADAM_OPTIONS),
    "sgd": ("sgd", 0.5, 0.0, {"sgd_momentum": 0.0}, "SGD", {}),
    "sgd_momentum": ("sgd", 0.2, 0.0, {"sgd_momentum": 0.9}, "SGD",
                     {"momentum": 0.9}),
    "sgd_dampening": ("sgd", 0.2, 0.0,
                      {"sgd_momentum": 0.9, "sgd_dampening": 0.3}, "SGD",
                      {"momentum": 0.9, "dampening": 0.3}),
    "sgd_nesterov": ("sgd", 0.2, 0.0,
                     {"sgd_momentum": 0.9, "sgd_nesterov": True}, "SGD",
                     {"momentum": 0.9, "nesterov": True}),
    "sgd_weight_decay": ("sgd", 0.2, 0.05, {"sgd_momentum": 0.9}, "SGD",
                         {"momentum": 0.9}),
    "adagrad": ("adagrad", 0.05, 0.05,
                {"adagrad_lr_decay": 0.01,
                 "adagrad_initial_accumulator_value": 0.1,
                 "adagrad_eps": 1e-10},
                "Adagrad",
                {"lr_decay": 0.01, "initial_accumulator_value": 0.1,
                 "eps": 1e-10}),
    "lion": ("lion", 1e-3, 0.1, {"lion_beta1": 0.9, "lion_beta2": 0.99}, None,
             None),
    # torch's amsgrad and maximize flags (after the cases above, whose files they
    # leave as they were). amsgrad with beta2 0.95, so that exp_avg_sq falls
    # below its running maximum often within 24 steps; maximize with weight
    # decay, which shows that the gradient is negated before the decay joins it.
    "adam_amsgrad": ("adam", 1e-2, 0.05, AMSGRAD_FIELDS, "Adam",
                     AMSGRAD_OPTIONS),
    "adamw_amsgrad": ("adamw", 1e-2, 0.1, AMSGRAD_FIELDS, "AdamW",
                      AMSGRAD_OPTIONS),
    "adam_maximize": ("adam", 1e-2, 0.05, dict(ADAM_FIELDS, maximize=True),
                      "Adam", dict(ADAM_OPTIONS, maximize=True)),
    "adamw_amsgrad_maximize": ("adamw", 1e-2, 0.1,
                               dict(AMSGRAD_FIELDS, maximize=True), "AdamW",
                               dict(AMSGRAD_OPTIONS, maximize=True)),
    "sgd_maximize": ("sgd", 0.2, 0.05,
                     {"sgd_momentum": 0.9, "sgd_dampening": 0.3,
                      "maximize": True}, "SGD",
                     {"momentum": 0.9, "dampening": 0.3, "maximize": True}),
    "sgd_nesterov_maximize": ("sgd", 0.2, 0.05,
                              {"sgd_momentum": 0.9, "sgd_nesterov": True,
                               "maximize": True}, "SGD",
                              {"momentum": 0.9, "nesterov": True,
                               "maximize": True}),
    "adagrad_maximize": ("adagrad", 0.05, 0.05,
                         {"adagrad_lr_decay": 0.01,
                          "adagrad_initial_accumulator_value": 0.1,
                          "adagrad_eps": 1e-10, "maximize": True},
                         "Adagrad",
                         {"lr_decay": 0.01, "initial_accumulator_value": 0.1,
                          "eps": 1e-10, "maximize": True}),
}


def run_torch(torch, name, inputs):
    """Trains case `name` with its torch.optim class in float32 (foreach=False);
    returns the weights after every step. Checks that torch's LambdaLR and the
    param groups used exactly the lr and weight decay the manifest records."""
    _, base_lr, base_wd, _, class_name, options = CASES[name]
    lrs, wds = schedule(base_lr, base_wd)
    params = [torch.tensor(w.copy()) for w in split(inputs[0])]
    groups = [{"params": [], "weight_decay": 0.0} for _ in range(NUM_GROUPS)]
    for tensor, (_, _, group) in zip(params, TENSORS):
        groups[group]["params"].append(tensor)
    optimizer = getattr(torch.optim, class_name)(
        groups, lr=base_lr, foreach=False, **options)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, LR_LAMBDAS)
    trajectory = []
    for s, grad in enumerate(inputs[1:]):
        for param, g in zip(params, split(grad)):
            param.grad = torch.tensor(g.copy())
        for k, group in enumerate(optimizer.param_groups):
            group["weight_decay"] = wds[s][k]
            assert group["lr"] == lrs[s][k], (name, s, k, group["lr"])
        with torch.no_grad():
            optimizer.step()
        scheduler.step()
        trajectory.append(torch.cat(params).numpy().copy())
    return trajectory


def run_lion(inputs):
    """Lion in float64 (Chen et al. 2023, Algorithm 2, decoupled weight decay):
      c = b1*m + (1-b1)*g;  p = p*(1 - lr*wd) - lr*sign(c);  m = b2*m + (1-b2)*g
    with the schedule's per-group lr and weight decay. The state stays float64;
    only the stored weights are rounded to float32."""
    _, base_lr, base_wd, fields, _, _ = CASES["lion"]
    beta1, beta2 = fields["lion_beta1"], fields["lion_beta2"]
    lrs, wds = schedule(base_lr, base_wd)
    group_of = np.concatenate(
        [np.full(numel, group) for _, numel, group in TENSORS])
    p = inputs[0].astype(np.float64)
    m = np.zeros_like(p)
    trajectory = []
    for s, grad in enumerate(inputs[1:]):
        g = grad.astype(np.float64)
        lr = np.array(lrs[s])[group_of]
        wd = np.array(wds[s])[group_of]
        c = beta1 * m + (1 - beta1) * g
        p = p * (1 - lr * wd) - lr * np.sign(c)
        m = beta2 * m + (1 - beta2) * g
        trajectory.append(p.astype(np.float32))
    return trajectory


def write_f32(out_dir, name, vectors):
    data = np.concatenate(vectors).astype("<f4")
    with open(os.path.join(out_dir, name), "wb") as f:
        f.write(data.tobytes())


def read_inputs(out_dir):
    data = np.fromfile(os.path.join(out_dir, "inputs.f32"), dtype="<f4")
    return list(data.reshape(STEPS + 1, PARAM_ELEMS))


def torch_child(kernels, out_dir):
    """Child process: runs every torch case with ATEN_CPU_CAPABILITY=`kernels`
    (set by the parent before torch loads) and prints torch's version."""
    import torch

    found = re.search(r"CPU capability usage: (.*)", torch.__config__.show())
    capability = found.group(1).strip() if found else "unknown"
    if capability != TORCH_KERNELS[kernels]:
        sys.exit(f"torch runs its {capability} kernels, not "
                 f"{TORCH_KERNELS[kernels]}: this CPU cannot run the {kernels} "
                 "variant (x86-64 with AVX2 is needed)")
    torch.set_num_threads(1)
    inputs = read_inputs(out_dir)
    for name, case in CASES.items():
        if case[4] is not None:
            write_f32(out_dir, f"{name}.torch_{kernels}.f32",
                      run_torch(torch, name, inputs))
    print(torch.__version__)


def manifest_text(manifest):
    """Indented JSON with each innermost list of numbers on one line, so that a
    step's per-group values read as one row."""
    text = json.dumps(manifest, indent=1)
    return re.sub(r"\[\s*([-+0-9.eE,\s]+?)\s*\]",
                  lambda m: "[" + ", ".join(
                      x.strip() for x in m.group(1).split(",")) + "]",
                  text) + "\n"


def main(out_dir):
    inputs = make_inputs()
    write_f32(out_dir, "inputs.f32", inputs)
    torch_version = None
    for kernels in TORCH_KERNELS:
        child = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--torch-child", kernels,
             out_dir],
            env=dict(os.environ, ATEN_CPU_CAPABILITY=kernels),
            check=True, stdout=subprocess.PIPE, text=True)
        torch_version = child.stdout.strip()
    write_f32(out_dir, "lion.float64.f32", run_lion(inputs))

    manifest = {
        "format": 1,
        "generator": "tests/golden/generate.py",
        "torch_version": torch_version,
        "steps": STEPS,
        "tensors": [{"name": n, "numel": k, "param_group": g}
                    for n, k, g in TENSORS],
        "inputs": "inputs.f32",
        "cases": [],
    }
    for name, (kind, base_lr, base_wd, fields, class_name, options) in (
            CASES.items()):
        lrs, wds = schedule(base_lr, base_wd)
        if class_name is None:
            reference = "Lion (Chen et al. 2023) in float64 from its formula"
            trajectories = {"float64": f"{name}.float64.f32"}
        else:
            reference = (f"torch.optim.{class_name}(foreach=False, "
                         f"{json.dumps(options, sort_keys=True)}) float32")
            trajectories = {f"torch_{k}": f"{name}.torch_{k}.f32"
                            for k in TORCH_KERNELS}
        manifest["cases"].append({
            "name": name,
            "reference": reference,
            "optimizer": dict(kind=kind, **fields),
            # lr[s][k], weight_decay[s][k]: group k's values at step s + 1.
            "lr": lrs,
            "weight_decay": wds,
            "trajectories": trajectories,
        })
    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        f.write(manifest_text(manifest))
    print(f"wrote {len(CASES)} cases of {STEPS} steps to {out_dir}",
          file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--torch-child":
        torch_child(sys.argv[2], sys.argv[3])
    else:
        main(sys.argv[1] if len(sys.argv) > 1 else HERE)
