"""DepotOptimizer is bit for bit torch.optim(foreach=False) in the patterns
trainers use: Adam, AdamW, SGD (momentum, Nesterov, dampening) and Adagrad,
each through every scenario below, over 30 steps, with 1 and 2 data-parallel
workers on 1 and 3 servers. After every step every parameter of every worker
has exactly the bits of the reference torch model's.

Scenarios (the model always has a parameter that is never used):
- grad_none: a branch used every other step, zero_grad(set_to_none=True);
- never_used: the branch used on every step (only `unused` lacks a grad);
- freeze_mid: a layer frozen (requires_grad False) at step 10;
- unfreeze: a layer frozen at construction and unfrozen at step 10;
- amsgrad (Adam, AdamW), maximize;
- per_group: the groups differ in betas and eps (Adam/AdamW), momentum or
  dampening (SGD), lr_decay and eps (Adagrad);
- weight_edit: an in-place edit of a weight at step 12 (every model);
- model_load: model.load_state_dict of other weights at step 12;
- torch_state: torch.optim trains the first 9 steps, then DepotOptimizer
  loads its state_dict (and the model's weights) and takes over;
- clip: global norm clipping (clip_grad=0.5 against torch's
  clip_grad_norm_), with the branch's gradient absent every other step. The
  servers sum the squares in double where torch sums per-tensor fp32 norms,
  so the clip coefficients differ in the last bits: this case is held to
  1e-6 of the largest weight, every other to the bit.

The reference sums the workers' gradients in rank order in fp32, as the
servers do. torch's AVX kernels fuse some multiply-adds (docs/optimizers.md),
so the test runs with ATEN_CPU_CAPABILITY=default, torch's portable kernels,
which round every operation as Depot does (tests/python/CMakeLists.txt sets
it; the test fails without it).
"""

import os
import threading

import pytest
import torch

import server_process
from conftest import server_binary
from depot.torch import DepotOptimizer

import depot

STEPS = 30
CHANGE_STEP = 10  # freeze, unfreeze, torch -> Depot
EDIT_STEP = 12  # weight edits and model loads
BATCH = 8
CHUNK_ELEMS = 64  # spreads the small model over every server

OPTIMIZERS = {
    "adam": (torch.optim.Adam, dict(lr=1e-2, betas=(0.9, 0.99),
                                    weight_decay=0.05)),
    "adamw": (torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.1)),
    "sgd": (torch.optim.SGD, dict(lr=0.05, momentum=0.9, weight_decay=0.01)),
    "sgd_nesterov": (torch.optim.SGD, dict(lr=0.05, momentum=0.9,
                                           nesterov=True, weight_decay=0.01)),
    "sgd_dampening": (torch.optim.SGD, dict(lr=0.05, momentum=0.8,
                                            dampening=0.3, weight_decay=0.01)),
    "adagrad": (torch.optim.Adagrad, dict(lr=0.05, lr_decay=0.01,
                                          weight_decay=0.01,
                                          initial_accumulator_value=0.1)),
}
SCENARIOS = ("grad_none", "never_used", "freeze_mid", "unfreeze", "amsgrad",
             "maximize", "per_group", "weight_edit", "model_load",
             "torch_state", "clip")
CLIP_NORM = 0.5
CLIP_TOLERANCE = 1e-6  # of the largest weight
# (workers, servers): every scenario of every optimizer runs on each.
TOPOLOGIES = ((1, 1), (1, 3), (2, 1), (2, 3))


@pytest.fixture(scope="module", autouse=True)
def portable_torch_kernels():
    if os.environ.get("ATEN_CPU_CAPABILITY") != "default":
        pytest.fail("run with ATEN_CPU_CAPABILITY=default: torch's AVX "
                    "kernels fuse multiply-adds, which no bitwise comparison "
                    "survives (ctest sets it)", pytrace=False)


@pytest.fixture(scope="module")
def three_servers():
    started = [server_process.start_server(server_binary(), ["--threads=2"])
               for _ in range(3)]
    try:
        yield [s.address for s in started]
    finally:
        for server in started:
            server.stop()


class Net(torch.nn.Module):
    def __init__(self, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.l1 = torch.nn.Linear(6, 12)
        self.l2 = torch.nn.Linear(12, 12)
        self.branch = torch.nn.Linear(12, 12)
        self.out = torch.nn.Linear(12, 3)
        self.unused = torch.nn.Parameter(torch.randn(5))

    def forward(self, x, use_branch):
        h = torch.tanh(self.l2(torch.tanh(self.l1(x))))
        if use_branch:
            h = h + torch.tanh(self.branch(h))
        return self.out(h)


def groups(model, kind, scenario):
    """Two groups (no decay on biases), as trainers have them; per_group
    gives the second its own fixed hyperparameters."""
    weights = [p for n, p in model.named_parameters() if "bias" not in n]
    biases = [p for n, p in model.named_parameters() if "bias" in n]
    second = {"params": biases, "weight_decay": 0.0}
    if scenario == "per_group":
        second.update({
            "adam": dict(betas=(0.8, 0.95), eps=1e-6),
            "adamw": dict(betas=(0.85, 0.9), eps=1e-5),
            "sgd": dict(momentum=0.5),
            "sgd_nesterov": dict(momentum=0.7),
            "sgd_dampening": dict(dampening=0.1),
            "adagrad": dict(lr_decay=0.1, eps=1e-6),
        }[kind])
    return [{"params": weights}, second]


def hparams(kind, scenario):
    values = dict(OPTIMIZERS[kind][1])
    if scenario == "amsgrad":
        values["amsgrad"] = True
    if scenario == "maximize":
        values["maximize"] = True
    return values


def batch(step, worker, workers):
    generator = torch.Generator().manual_seed(100 + step)
    x = torch.randn(BATCH, 6, generator=generator)
    y = torch.randn(BATCH, 3, generator=generator)
    part = BATCH // workers
    return x[worker * part:(worker + 1) * part], y[worker * part:(worker + 1) * part]


def use_branch(scenario, step):
    return step % 2 == 0 if scenario in ("grad_none", "clip") else True


def backward(model, scenario, step, worker, workers):
    x, y = batch(step, worker, workers)
    out = model(x, use_branch(scenario, step))
    (torch.nn.functional.mse_loss(out, y) / workers).backward()


def before_step(models, scenario, step):
    """The scenario's change to every model (Depot's workers and the
    reference alike) before step `step` (1-based)."""
    if scenario == "freeze_mid" and step == CHANGE_STEP:
        for m in models:
            m.l2.requires_grad_(False)
    if scenario == "unfreeze" and step == CHANGE_STEP:
        for m in models:
            m.l2.requires_grad_(True)
    if scenario == "weight_edit" and step == EDIT_STEP:
        with torch.no_grad():
            for m in models:
                m.l1.weight.mul_(0.5)
                m.out.bias.add_(0.25)
    if scenario == "model_load" and step == EDIT_STEP:
        other = Net(seed=7).state_dict()
        for m in models:
            m.load_state_dict(other)


def lr_lambda(step):
    return min(1.0, (step + 1) / 5) * 0.97 ** step


def run_case(kind, scenario, workers, servers, check=None):
    """Trains `workers` DepotOptimizer workers and the torch.optim reference
    side by side, comparing every parameter's bits after every step; then
    calls check(opts, models, torch_opt, reference) before the job is
    deleted."""
    torch_class, _ = OPTIMIZERS[kind]
    optimizer = "sgd" if kind.startswith("sgd") else kind
    values = hparams(kind, scenario)
    reference = Net(seed=0)
    models = [Net(seed=0) for _ in range(workers)]
    if scenario == "unfreeze":
        for m in models + [reference]:
            m.l2.requires_grad_(False)
    torch_opt = torch_class(groups(reference, kind, scenario), foreach=False,
                            **values)
    torch_sched = torch.optim.lr_scheduler.LambdaLR(torch_opt, lr_lambda)
    client = depot.Client(servers)
    job_name = f"matrix-{kind}-{scenario}-w{workers}-s{len(servers)}"
    clip = dict(clip_grad=CLIP_NORM) if scenario == "clip" else {}
    opts = [DepotOptimizer(groups(m, kind, scenario), client=client,
                           job_name=job_name, optimizer=optimizer,
                           num_workers=workers, worker_rank=rank,
                           chunk_elems=CHUNK_ELEMS, **clip, **values)
            for rank, m in enumerate(models)]
    scheds = [torch.optim.lr_scheduler.LambdaLR(o, lr_lambda) for o in opts]
    depot_from = CHANGE_STEP if scenario == "torch_state" else 1
    try:
        for step in range(1, STEPS + 1):
            before_step(models + [reference], scenario, step)
            if step == depot_from and scenario == "torch_state":
                for m, o, s in zip(models, opts, scheds):
                    m.load_state_dict(reference.state_dict())
                    o.load_state_dict(torch_opt.state_dict())
                    s.load_state_dict(torch_sched.state_dict())
            torch_opt.zero_grad(set_to_none=True)
            for worker in range(workers):
                backward(reference, scenario, step, worker, workers)
            if scenario == "clip":
                torch.nn.utils.clip_grad_norm_(
                    [p for p in reference.parameters() if p.grad is not None],
                    CLIP_NORM)
            torch_opt.step()
            torch_sched.step()
            if step < depot_from:
                continue
            errors = []

            def work(rank):
                try:
                    opts[rank].zero_grad(set_to_none=True)
                    backward(models[rank], scenario, step, rank, workers)
                    opts[rank].step()
                    scheds[rank].step()
                except BaseException as e:  # noqa: B902 (re-raised below)
                    errors.append(e)

            threads = [threading.Thread(target=work, args=(r,))
                       for r in range(workers)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            if errors:
                raise errors[0]
            for rank, m in enumerate(models):
                if scenario == "clip":
                    assert_close(m, reference, step, rank)
                    continue
                for (name, p), q in zip(m.named_parameters(),
                                        reference.parameters()):
                    if not torch.equal(p.view(torch.int32),
                                       q.view(torch.int32)):
                        pytest.fail(
                            f"step {step}, worker {rank}: {name} differs from "
                            f"torch.optim by up to "
                            f"{(p - q).abs().max().item():.3g}", pytrace=False)
        if check is not None:
            check(opts, models, torch_opt, reference)
    finally:
        opts[0].job.delete()
        client.close()


def matrix():
    """Every (kind, scenario, topology); amsgrad only where torch.optim has
    it (Adam, AdamW)."""
    return [pytest.param(kind, scenario, topology,
                         id=f"{kind}-{scenario}-w{topology[0]}-s{topology[1]}")
            for kind in sorted(OPTIMIZERS) for scenario in SCENARIOS
            for topology in TOPOLOGIES
            if scenario != "amsgrad" or kind in ("adam", "adamw")]


@pytest.mark.parametrize("kind,scenario,topology", matrix())
def test_bitwise_equal_to_torch_optim(kind, scenario, topology, servers,
                                      three_servers):
    workers, server_count = topology
    addresses = three_servers if server_count == 3 else servers[:1]
    run_case(kind, scenario, workers, addresses)


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
def test_state_equals_torchs_and_round_trips_bitwise(kind, three_servers):
    """optimizer.state[p] holds torch's keys and values; torch -> Depot ->
    torch gives torch's state dict back bit for bit."""
    scenario = "amsgrad" if kind in ("adam", "adamw") else "grad_none"
    _, values = OPTIMIZERS[kind]

    def check(opts, models, torch_opt, reference):
        for (name, p), q in zip(models[0].named_parameters(),
                                reference.parameters()):
            # .get: torch's state is a defaultdict, [] would add an entry.
            assert_same_state(opts[0].state[p], torch_opt.state.get(q, {}),
                              name)
        saved = torch_opt.state_dict()
        # torch -> Depot: a fresh optimizer on the same weights takes it.
        twin = Net(seed=0)
        twin.load_state_dict(reference.state_dict())
        client = depot.Client(three_servers)
        moved = DepotOptimizer(groups(twin, kind, scenario), client=client,
                               job_name=f"roundtrip-{kind}",
                               optimizer="sgd" if kind.startswith("sgd")
                               else kind, chunk_elems=CHUNK_ELEMS,
                               **hparams(kind, scenario))
        try:
            moved.load_state_dict(saved)
            back = moved.torch_state_dict()
            assert back["param_groups"] == saved["param_groups"]
            assert set(back["state"]) == set(saved["state"])
            for index, want in saved["state"].items():
                assert_same_state(back["state"][index], want, f"param {index}")
            # Depot -> torch: torch.optim loads what Depot gives.
            again = type(torch_opt)(groups(Net(seed=0), kind, scenario),
                                    foreach=False, **hparams(kind, scenario))
            again.load_state_dict(back)
            for index, want in saved["state"].items():
                assert_same_state(again.state_dict()["state"][index], want,
                                  f"param {index} in torch")
        finally:
            moved.job.delete()
            client.close()

    run_case(kind, scenario, 1, three_servers, check)


def assert_close(model, reference, step, rank):
    have = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    want = torch.cat([p.detach().reshape(-1) for p in reference.parameters()])
    difference = (have - want).abs().max().item()
    bound = CLIP_TOLERANCE * want.abs().max().item()
    if not difference <= bound:
        pytest.fail(f"step {step}, worker {rank}: weights differ from torch "
                    f"by {difference:.3g}, more than {bound:.3g}",
                    pytrace=False)


def assert_same_state(have, want, where):
    assert set(have) == set(want), f"{where}: keys {set(have)} vs {set(want)}"
    for key, value in want.items():
        if value is None or not torch.is_tensor(value):
            assert have[key] == value, f"{where}: {key}"
            continue
        assert torch.equal(have[key].reshape(value.shape).view(torch.int32),
                           value.float().view(torch.int32)), (
            f"{where}: {key} differs")
