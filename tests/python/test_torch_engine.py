"""DepotOptimizer in engine mode (docs/gpu.md, "PyTorch on GPUs"), run over
the host engine (engine="host": the same driver, hooks and C API as on CUDA,
with device memory in host memory), against real depot-server processes and
torch.optim, bit for bit.

The parameters' .grad and storage are views into the engine's buffers, each
bucket leaves from inside backward, and the updated weights come back into
the parameters' storage. What CUDA adds (streams, the CUDA backend) is in
tests/gpu and skips without a device.
"""

import contextlib
import copy

import pytest
import torch

import depot
import depot.torch
from depot.torch import DepotOptimizer

STEPS = 5


def model_and_data(dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 8),
        torch.nn.Tanh(), torch.nn.Linear(8, 4)).to(dtype)
    inputs = [torch.randn(6, 16, dtype=dtype) for _ in range(STEPS + 2)]
    targets = [torch.randn(6, 4, dtype=dtype) for _ in range(STEPS + 2)]
    return model, inputs, targets


def loss_of(model, x, y):
    return ((model(x) - y) ** 2).mean()


def train(model, opt, inputs, targets, steps=STEPS, set_to_none=True):
    for s in range(steps):
        opt.zero_grad(set_to_none=set_to_none)
        loss_of(model, inputs[s], targets[s]).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def assert_bitwise(got, want):
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype
        assert torch.equal(g.view(torch.int16 if g.element_size() == 2
                                  else torch.int32),
                           w.view(torch.int16 if w.element_size() == 2
                                  else torch.int32)), f"parameter {i}"


def small_chunks(**kwargs):
    # 64-element chunks: the 5-layer model spans many buckets, so several
    # leave during backward.
    return dict(chunk_elems=64, bucket_chunks=1, **kwargs)


def beside_torch(model, client, job_name, **hparams):
    """A DepotOptimizer (host engine, small chunks, lr 1e-2 and `hparams`)
    over `model`, and a copy of the model with torch.optim.AdamW of the same
    hyperparameters: (opt, reference, ref_opt)."""
    reference = copy.deepcopy(model)
    opt = DepotOptimizer(model.parameters(), client=client,
                         job_name=job_name, engine="host", lr=1e-2,
                         **hparams, **small_chunks())
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2,
                                foreach=False, **hparams)
    return opt, reference, ref_opt


@pytest.mark.parametrize("set_to_none", [True, False])
def test_engine_adamw_is_torch_bit_for_bit(client, job_name, set_to_none):
    model, inputs, targets = model_and_data()
    reference = copy.deepcopy(model)
    opt = DepotOptimizer(model.parameters(), client=client,
                         job_name=job_name, engine="host", lr=1e-2,
                         weight_decay=0.1, **small_chunks())
    assert opt.engine is not None and opt.engine.num_buckets > 4
    got = train(model, opt, inputs, targets, set_to_none=set_to_none)
    want = train(reference, torch.optim.AdamW(
        reference.parameters(), lr=1e-2, weight_decay=0.1, foreach=False),
        inputs, targets, set_to_none=set_to_none)
    assert_bitwise(got, want)
    # The parameters live in the engine's weights buffer, and their
    # gradients in its gradient buffer.
    weights = opt.engine.weights_address()
    size = 4
    span = opt.engine.padded_elems * size
    for p in model.parameters():
        assert weights <= p.data_ptr() < weights + span
        assert p.grad is not None
    opt.close()
    # After close() the parameters own their storage again, same values.
    assert_bitwise([p.detach() for p in model.parameters()], got)


def test_engine_buckets_leave_during_backward(client, job_name):
    model, inputs, targets = model_and_data()
    opt = DepotOptimizer(model.parameters(), client=client,
                         job_name=job_name, engine="host", lr=1e-2,
                         **small_chunks())
    named = []
    real = opt.engine.gradients_ready

    def record(bucket, stream=0):
        named.append((bucket, torch.is_grad_enabled()))
        real(bucket, stream)

    opt.engine.gradients_ready = record
    opt.zero_grad()
    loss_of(model, inputs[0], targets[0]).backward()
    during_backward = len(named)
    opt.step()
    # Every bucket was named once; all of them from inside backward (the
    # model's parameters all need gradients), last bucket first.
    assert sorted(b for b, _ in named) == list(range(opt.engine.num_buckets))
    assert during_backward == opt.engine.num_buckets
    assert named[0][0] == opt.engine.num_buckets - 1
    opt.close()


def test_engine_bf16_with_schedule_and_frozen_layer(client, job_name):
    """bf16 parameters: torch.optim keeps bf16 state where Depot keeps fp32
    masters and moments, so the reference is DepotOptimizer's own host path
    (no engine), which the other parity tests compare with torch."""
    model, inputs, targets = model_and_data(torch.bfloat16)
    reference = copy.deepcopy(model)
    for m in (model, reference):
        m[2].weight.requires_grad_(False)
    opt = DepotOptimizer(model.parameters(), client=client,
                         job_name=job_name, engine="host", lr=1e-2,
                         **small_chunks())
    ref_opt = DepotOptimizer(reference.parameters(), client=client,
                             job_name=f"{job_name}-ref", lr=1e-2,
                             chunk_elems=64)
    scheds = [torch.optim.lr_scheduler.StepLR(o, 2, 0.5)
              for o in (opt, ref_opt)]
    for s in range(STEPS):
        for m, o, sched in zip((model, reference), (opt, ref_opt), scheds):
            o.zero_grad()
            loss_of(m, inputs[s], targets[s]).backward()
            o.step()
            sched.step()
    assert_bitwise([p.detach() for p in model.parameters()],
                   [p.detach() for p in reference.parameters()])
    assert opt.state[model[0].weight]["step"] == STEPS
    assert model[2].weight not in opt.state  # frozen: never stepped
    opt.close()


def test_engine_attach_waits_per_bucket_in_forward(client, job_name):
    """attach(model): step() leaves the weights' waits to forward, where
    each module waits for its own buckets only (first layer first); still
    torch bit for bit."""
    model, inputs, targets = model_and_data()
    reference = copy.deepcopy(model)
    opt = DepotOptimizer(model.parameters(), client=client,
                         job_name=job_name, engine="host", lr=1e-2,
                         **small_chunks())
    opt.attach(model)
    waits = []
    real = opt.engine.wait_weights

    def record(bucket, stream=0):
        waits.append(bucket)
        real(bucket, stream)

    opt.engine.wait_weights = record
    train(model, opt, inputs, targets)
    buckets = opt.engine.num_buckets
    # Every forward after a step waited for every bucket once, in the
    # modules' order: the first layer's buckets first.
    assert len(waits) == (STEPS - 1) * buckets
    assert waits[:buckets] == sorted(waits[:buckets])
    # The last step's weights are waited for by the next forward; read
    # outside one, they need wait_weights() first (docs/gpu.md), or the
    # last buckets' copies may still be running.
    opt.engine.wait_weights = real
    opt.wait_weights()
    got = [p.detach().clone() for p in model.parameters()]
    want = train(reference, torch.optim.AdamW(
        reference.parameters(), lr=1e-2, foreach=False), inputs, targets)
    assert_bitwise(got, want)
    with pytest.raises(ValueError, match="not parameters of the model"):
        opt.attach(torch.nn.Linear(2, 2))
    opt.close()


class Branchy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 8)
        self.b = torch.nn.Linear(8, 8)
        self.c = torch.nn.Linear(8, 2)

    def forward(self, x, use_b):
        h = torch.tanh(self.a(x))
        if use_b:
            h = torch.tanh(self.b(h))
        return self.c(h)


def train_branchy(model, opt, steps):
    torch.manual_seed(1)
    for s in range(steps):
        opt.zero_grad(set_to_none=True)
        x, y = torch.randn(4, 8), torch.randn(4, 2)
        ((model(x, use_b=s % 2 == 0) - y) ** 2).mean().backward()
        opt.step()


def test_engine_unused_parameters_are_skipped_as_torch(client, job_name):
    torch.manual_seed(0)
    model = Branchy()
    reference = copy.deepcopy(model)
    opt = DepotOptimizer(model.parameters(), client=client,
                         job_name=job_name, engine="host", lr=1e-2,
                         weight_decay=0.1, find_unused_parameters=True,
                         **small_chunks())
    train_branchy(model, opt, STEPS)
    train_branchy(reference, torch.optim.AdamW(
        reference.parameters(), lr=1e-2, weight_decay=0.1, foreach=False),
        STEPS)
    assert_bitwise([p.detach() for p in model.parameters()],
                   [p.detach() for p in reference.parameters()])
    opt.close()


def test_engine_unused_parameter_without_the_flag_raises(client, job_name):
    torch.manual_seed(0)
    model = Branchy()
    opt = DepotOptimizer(model.parameters(), client=client,
                         job_name=job_name, engine="host", lr=1e-2,
                         **small_chunks())
    opt.zero_grad()
    ((model(torch.randn(4, 8), use_b=False)) ** 2).mean().backward()
    with pytest.raises(RuntimeError, match="find_unused_parameters=True"):
        opt.step()
    opt.close()


def test_engine_second_backward_needs_no_sync(client, job_name):
    model, inputs, targets = model_and_data()
    opt, reference, ref_opt = beside_torch(model, client, job_name)
    for s in range(2):
        for m, o in ((model, opt), (reference, ref_opt)):
            o.zero_grad()
            with o.no_sync() if o is opt else torch.no_grad():
                if o is opt:
                    loss_of(m, inputs[2 * s], targets[2 * s]).backward()
            if o is not opt:
                loss_of(m, inputs[2 * s], targets[2 * s]).backward()
            loss_of(m, inputs[2 * s + 1], targets[2 * s + 1]).backward()
            o.step()
    assert_bitwise([p.detach() for p in model.parameters()],
                   [p.detach() for p in reference.parameters()])
    # Without no_sync, the second backward is refused.
    opt.zero_grad()
    loss_of(model, inputs[0], targets[0]).backward()
    with pytest.raises(RuntimeError, match="no_sync"):
        loss_of(model, inputs[1], targets[1]).backward()
    opt.close()


def one_step_stale(initial, backward, steps=STEPS):
    """The delayed update's reference: torch.optim.AdamW (lr 1e-2) on master
    weights from `initial` (a model), each step's gradient made by
    `backward(reference, ref_opt, s)` on a copy whose weights are two steps
    old (forward s, 0-based, sees the master before step s - 1). Returns the
    masters' parameters after `steps` steps."""
    reference = copy.deepcopy(initial)
    master = copy.deepcopy(initial)
    ref_opt = torch.optim.AdamW(master.parameters(), lr=1e-2, foreach=False)
    history = [copy.deepcopy(master.state_dict())] * 2
    for s in range(steps):
        reference.load_state_dict(history[-2])
        reference.zero_grad()
        backward(reference, ref_opt, s)
        for p_master, p_ref in zip(master.parameters(),
                                   reference.parameters()):
            p_master.grad = p_ref.grad.clone()
        ref_opt.step()
        history.append(copy.deepcopy(master.state_dict()))
    return [p.detach() for p in master.parameters()]


MICRO = 4  # micro-batches of an accumulated step


def accumulate(model, opt, inputs, targets, s, drop_grad):
    """Step s's gradient over MICRO micro-batches, all but the last inside
    no_sync (for DepotOptimizer); with drop_grad, the first layer's .grad is
    set to None after the second, so the rest of the step's gradient starts
    afresh there, as in torch."""
    for micro in range(MICRO):
        x = inputs[(s + micro) % len(inputs)]
        y = targets[(s + micro) % len(targets)]
        last = micro == MICRO - 1
        with opt.no_sync() if isinstance(opt, DepotOptimizer) and not last \
                else contextlib.nullcontext():
            (loss_of(model, x, y) / MICRO).backward()
        if drop_grad and micro == 1:
            model[0].weight.grad = None


def assert_grads_are_views(opt, model):
    """Every .grad lies in the engine's gradient buffer of the step being
    accumulated (the hooks' fast path must keep that true)."""
    driver = opt._driver
    buffer = driver._grad_buffer(driver.step)
    lo = buffer.data_ptr()
    hi = lo + buffer.numel() * buffer.element_size()
    for i, p in enumerate(model.parameters()):
        assert lo <= p.grad.data_ptr() < hi, f"parameter {i}"


@pytest.mark.parametrize("set_to_none", [True, False])
def test_engine_accumulation_over_micro_batches_is_torch_bit_for_bit(
        client, job_name, set_to_none):
    """Several micro-batches in no_sync (the hooks' fast path: autograd
    accumulates into the view in place), with a .grad dropped midway (a
    fresh gradient the hook must adopt), equal torch.optim.AdamW."""
    model, inputs, targets = model_and_data()
    opt, reference, ref_opt = beside_torch(model, client, job_name,
                                           weight_decay=0.1)
    for s in range(STEPS):
        for m, o in ((model, opt), (reference, ref_opt)):
            o.zero_grad(set_to_none=set_to_none)
            accumulate(m, o, inputs, targets, s, drop_grad=(s == 2))
            if o is opt:
                assert_grads_are_views(opt, m)
            o.step()
    assert_bitwise([p.detach() for p in model.parameters()],
                   [p.detach() for p in reference.parameters()])
    opt.close()


def test_engine_delayed_update_accumulates_into_the_steps_buffer(
        client, job_name):
    """With the delayed update the gradient buffers alternate by step: the
    micro-batches of each step accumulate into its own (the hooks' fast path
    compares against that step's views), and the result is the one-step-
    stale reference's, bit for bit."""
    model, inputs, targets = model_and_data()
    reference = copy.deepcopy(model)
    opt = DepotOptimizer(model.parameters(), client=client,
                         job_name=job_name, engine="host", lr=1e-2,
                         delayed_update=True, **small_chunks())
    for s in range(STEPS):
        opt.zero_grad()
        accumulate(model, opt, inputs, targets, s, drop_grad=(s == 3))
        assert_grads_are_views(opt, model)
        opt.step()
    opt.synchronize()
    assert_bitwise([p.detach() for p in model.parameters()],
                   one_step_stale(reference, lambda r, o, s: accumulate(
                       r, o, inputs, targets, s, drop_grad=(s == 3))))
    opt.close()


def train_changing_after_backward(model, opt, inputs, targets, steps, edit):
    """torch's usual loop with a change between backward and step():
    `edit(model, opt, s)`."""
    for s in range(steps):
        opt.zero_grad()
        loss_of(model, inputs[s], targets[s]).backward()
        edit(model, opt, s)
        opt.step()


def clip(model, opt, s):
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)


def halve_out_of_place(model, opt, s):
    model[2].weight.grad = model[2].weight.grad * 0.5


def warm_up_lr(model, opt, s):  # a manual schedule, set after backward
    for group in opt.param_groups:
        group["lr"] = 1e-3 * (s + 1)


@pytest.mark.parametrize("edit, what", [
    (clip, "changed in place"), (halve_out_of_place, "replaced for parameter"),
    (warm_up_lr, "lr or weight_decay changed")])
def test_engine_changes_after_backward_raise(client, job_name, edit, what):
    """The buckets (and the step's lr and weight decay) left during
    backward: a change after it cannot reach them. step() completes the step
    (the job stays consistent: the next steps run) and raises, never
    silently."""
    model, inputs, targets = model_and_data()
    opt = DepotOptimizer(model.parameters(), client=client,
                         job_name=job_name, engine="host", lr=1e-2,
                         **small_chunks())
    with pytest.raises(RuntimeError, match=what + ".*overlap_backward=False"):
        train_changing_after_backward(model, opt, inputs, targets, 1, edit)
    assert opt.job.status()[0].step == 1
    train(model, opt, inputs[1:], targets[1:], steps=2)  # no change after
    assert opt.job.status()[0].step == 3
    opt.close()


@pytest.mark.parametrize("edit", [clip, halve_out_of_place, warm_up_lr])
def test_engine_without_overlap_sends_what_changed_after_backward(
        client, job_name, edit):
    """overlap_backward=False: the step begins at step(), so clip_grad_norm_
    (or any change to the gradients or the lr) after backward is in the step
    sent: torch's result bit for bit."""
    model, inputs, targets = model_and_data()
    reference = copy.deepcopy(model)
    opt = DepotOptimizer(model.parameters(), client=client,
                         job_name=job_name, engine="host", lr=1e-2,
                         overlap_backward=False, **small_chunks())
    train_changing_after_backward(model, opt, inputs, targets, STEPS, edit)
    train_changing_after_backward(reference, torch.optim.AdamW(
        reference.parameters(), lr=1e-2, foreach=False), inputs, targets,
        STEPS, edit)
    assert_bitwise([p.detach() for p in model.parameters()],
                   [p.detach() for p in reference.parameters()])
    opt.close()


def test_overlap_backward_is_checked(client, job_name):
    model, _, _ = model_and_data()
    with pytest.raises(TypeError, match="overlap_backward"):
        DepotOptimizer(model.parameters(), client=client, job_name=job_name,
                       engine="host", overlap_backward="no")
    with pytest.raises(ValueError, match="overlap_backward"):
        DepotOptimizer(model.parameters(), client=client, job_name=job_name,
                       overlap_backward=False)  # no engine: nothing to overlap


@pytest.mark.parametrize("layer", [0, 2, 4])
@pytest.mark.parametrize("set_to_none", [True, False])
@pytest.mark.parametrize("frozen_at_construction", [False, True])
def test_engine_freezing_and_unfreezing_between_steps_is_torch_bit_for_bit(
        client, job_name, layer, set_to_none, frozen_at_construction):
    """A layer frozen every other step (requires_grad toggled before the
    step's backward). With zero_grad(set_to_none=False), torch 1.13's
    default, the frozen layer keeps a zero .grad and torch steps it (decay
    and moments): so must Depot. Unfrozen, it is waited for again by its
    buckets (counted when the step begins, not when the last one ended).
    Frozen when the optimizer is made, it has no hook at first (a tensor
    without requires_grad cannot have one): the step it is first unfrozen
    begins at step(), and it gets its hook then."""
    model, inputs, targets = model_and_data()
    if frozen_at_construction:
        model[layer].weight.requires_grad_(False)
    opt, reference, ref_opt = beside_torch(model, client, job_name,
                                           weight_decay=0.1)
    for s in range(STEPS):
        for m, o in ((model, opt), (reference, ref_opt)):
            m[layer].weight.requires_grad_(s % 2 == 1)
            o.zero_grad(set_to_none=set_to_none)
            loss_of(m, inputs[s], targets[s]).backward()
            o.step()
    assert_bitwise([p.detach() for p in model.parameters()],
                   [p.detach() for p in reference.parameters()])
    opt.close()


def test_engine_weights_edited_outside_become_master(client, job_name):
    model, inputs, targets = model_and_data()
    opt, reference, ref_opt = beside_torch(model, client, job_name)
    for s in range(4):
        if s == 2:
            with torch.no_grad():
                for m in (model, reference):
                    m[0].weight.mul_(0.5)  # an in-place edit
        for m, o in ((model, opt), (reference, ref_opt)):
            o.zero_grad()
            loss_of(m, inputs[s], targets[s]).backward()
            if o is opt and s == 2:
                with pytest.warns(UserWarning, match="changed outside"):
                    o.step()
            else:
                o.step()
    assert_bitwise([p.detach() for p in model.parameters()],
                   [p.detach() for p in reference.parameters()])
    opt.close()


def test_engine_state_dict_round_trip(client, job_name):
    model, inputs, targets = model_and_data()
    opt = DepotOptimizer(model.parameters(), client=client,
                         job_name=job_name, engine="host", lr=1e-2,
                         **small_chunks())
    train(model, opt, inputs, targets, steps=2)
    saved_opt = opt.state_dict()
    saved_model = copy.deepcopy(model.state_dict())
    train(model, opt, inputs[2:], targets[2:], steps=2)
    after = [p.detach().clone() for p in model.parameters()]
    # Back to step 2 and the same two steps again: the same weights.
    model.load_state_dict(saved_model)
    opt.load_state_dict(saved_opt)
    train(model, opt, inputs[2:], targets[2:], steps=2)
    assert_bitwise([p.detach() for p in model.parameters()], after)
    opt.close()


def host_engine_opt(model, client, job_name, **options):
    """A DepotOptimizer with a host engine over `model` (lr 1e-2, small
    chunks, `options`)."""
    return DepotOptimizer(model.parameters(), client=client,
                          job_name=job_name, engine="host", lr=1e-2,
                          **options, **small_chunks())


@pytest.mark.parametrize("clip_grad,inf_at", [(0.0, None), (1e-2, None),
                                               (1e-2, 2)])
def test_engine_offload_fraction_equals_full_offload(client, job_name,
                                                     clip_grad, inf_at):
    """Half the parameters' optimizer on the device, bit for bit the fully
    offloaded run; also clipping by the global norm, which then covers the
    kept parameters too (the servers measure it and send their sums and
    decision), and with a step whose gradients are not finite, which the
    servers skip: the kept parameters skip it too (no update, no count)."""
    results = []
    for fraction in (1.0, 0.5):
        model, inputs, targets = model_and_data()
        if inf_at is not None:
            inputs[inf_at] = inputs[inf_at].clone()
            inputs[inf_at][0, 0] = float("inf")
        opt = host_engine_opt(model, client, f"{job_name}-{fraction}",
                              weight_decay=0.1, clip_grad=clip_grad,
                              offload_fraction=fraction)
        if fraction < 1:
            assert opt.engine.device_tensors  # some stay on the "GPU"
        skipped = []
        for s in range(STEPS):
            opt.zero_grad()
            loss_of(model, inputs[s], targets[s]).backward()
            opt.step()
            skipped.append(opt.last_result.skipped)
            if clip_grad and s != inf_at:
                assert opt.last_result.clip_coef < 1  # the step did clip
        assert skipped == [s == inf_at for s in range(STEPS)]
        results.append([p.detach().clone() for p in model.parameters()])
        opt.close()
    assert all(torch.isfinite(p).all() for p in results[1])
    assert_bitwise(results[1], results[0])


def test_engine_offload_fraction_state_is_the_whole_jobs(client, job_name):
    """With half the parameters' optimizer on the device, the state read
    (torch_state_dict, state[p]) equals the fully offloaded run's bit for
    bit, step counts included: the kept parameters' part comes from the
    device, not from the servers, which never updated it."""
    states = []
    for fraction in (1.0, 0.5):
        model, inputs, targets = model_and_data()
        opt = host_engine_opt(model, client, f"{job_name}-{fraction}",
                              weight_decay=0.1, offload_fraction=fraction)
        train(model, opt, inputs, targets, steps=3)
        states.append(opt.torch_state_dict()["state"])
        last = list(model.parameters())[-1]
        assert int(opt.state[last]["step"]) == 3
        opt.close()
    full, kept = states
    assert full.keys() == kept.keys()
    for index in full:
        for key in full[index]:
            assert_bitwise([torch.as_tensor(kept[index][key])],
                           [torch.as_tensor(full[index][key])])


def test_engine_offload_fraction_state_dict_round_trip(client, job_name):
    """state_dict() by value holds the kept parameters' state from the
    device, and load_state_dict() puts it back there, also in a new
    optimizer of another job: the steps after it equal the uninterrupted
    run's bit for bit."""
    model, inputs, targets = model_and_data()
    opt = DepotOptimizer(model.parameters(), client=client,
                         job_name=job_name, engine="host", lr=1e-2,
                         offload_fraction=0.5, **small_chunks())
    assert opt.engine.device_tensors
    train(model, opt, inputs, targets, steps=2)
    saved_opt = opt.state_dict()
    saved_model = copy.deepcopy(model.state_dict())
    train(model, opt, inputs[2:], targets[2:], steps=3)
    after = [p.detach().clone() for p in model.parameters()]
    opt.close()
    fresh = copy.deepcopy(model)
    fresh.load_state_dict(saved_model)
    opt = DepotOptimizer(fresh.parameters(), client=client,
                         job_name=f"{job_name}-loaded", engine="host",
                         lr=1e-2, offload_fraction=0.5, **small_chunks())
    opt.load_state_dict(saved_opt)
    train(fresh, opt, inputs[2:], targets[2:], steps=3)
    assert_bitwise([p.detach() for p in fresh.parameters()], after)
    opt.close()


def test_engine_offload_fraction_refuses_state_it_cannot_hold(client,
                                                             job_name):
    """resume=True opens the job, but the kept parameters' state died with
    the old optimizer: step() and state_dict() refuse, naming
    load_state_dict(), until a state saved by value is loaded into the same
    job; then the steps go on bit for bit as the uninterrupted run's. (A
    reference holds the kept state too: test_state_reference.py.)"""
    model, inputs, targets = model_and_data()
    initial = copy.deepcopy(model)
    opt = DepotOptimizer(model.parameters(), client=client,
                         job_name=job_name, engine="host", lr=1e-2,
                         offload_fraction=0.5, **small_chunks())
    train(model, opt, inputs, targets, steps=2)
    saved_opt = opt.state_dict()
    saved_model = copy.deepcopy(model.state_dict())
    train(model, opt, inputs[2:], targets[2:], steps=3)
    after = [p.detach().clone() for p in model.parameters()]
    opt.close()  # the trainer is gone; the job stays on the servers, at 5

    resumed = copy.deepcopy(initial)
    opt = DepotOptimizer(resumed.parameters(), client=client,
                         job_name=job_name, engine="host", lr=1e-2,
                         offload_fraction=0.5, resume=True, **small_chunks())
    assert opt.resumed_step == 5
    with pytest.raises(depot.FailedPreconditionError,
                       match="ReadGpuState: .*applied step 5.*load a saved"):
        opt.state_dict()
    with pytest.raises(depot.FailedPreconditionError,
                       match="load_state_dict"):
        train(resumed, opt, inputs[2:], targets[2:], steps=1)
    resumed.load_state_dict(saved_model)
    opt.load_state_dict(saved_opt)
    train(resumed, opt, inputs[2:], targets[2:], steps=3)
    assert_bitwise([p.detach() for p in resumed.parameters()], after)
    opt.close()


def test_engine_delayed_update_is_one_step_stale(client, job_name):
    """With the delayed update, step s's forward sees the weights of step
    s - 2: the reference applies torch.optim to master weights and runs each
    forward on a copy two steps old."""
    model, inputs, targets = model_and_data()
    reference = copy.deepcopy(model)
    opt = DepotOptimizer(model.parameters(), client=client,
                         job_name=job_name, engine="host", lr=1e-2,
                         delayed_update=True, **small_chunks())
    train(model, opt, inputs, targets)
    opt.synchronize()
    assert_bitwise([p.detach() for p in model.parameters()],
                   one_step_stale(reference, lambda r, o, s: loss_of(
                       r, inputs[s], targets[s]).backward()))
    opt.close()


def test_engine_options_need_an_engine(client, job_name):
    model, _, _ = model_and_data()
    with pytest.raises(ValueError, match="engine"):
        DepotOptimizer(model.parameters(), client=client, job_name=job_name,
                       delayed_update=True)
    with pytest.raises(ValueError, match="engine must be"):
        DepotOptimizer(model.parameters(), client=client, job_name=job_name,
                       engine="tpu")


def test_engine_refuses_a_negative_collective_timeout(client, job_name):
    """The C API checks collective_timeout_seconds (0: no limit)."""
    job = client.open_job(job_name, [("w", 128, 0)], lr=1e-3)
    with pytest.raises(depot.InvalidArgumentError,
                       match="collective_timeout_seconds -1 is not >= 0"):
        depot.Engine(job, "host", collective_timeout_s=-1)
    depot.Engine(job, "host", collective_timeout_s=0).close()
    job.close()


def test_engine_refuses_mixed_dtypes(client, job_name):
    model, _, _ = model_and_data()
    model[0].to(torch.bfloat16)
    with pytest.raises(TypeError, match="one dtype"):
        DepotOptimizer(model.parameters(), client=client, job_name=job_name,
                       engine="host")


def test_cuda_engine_without_a_gpu_says_why(client, job_name):
    """The CUDA engine through the C API: libdepot_cuda.so loads (it is built
    beside libdepot_client.so whenever CUDA is), and without a GPU the
    device's own error comes back as UNAVAILABLE."""
    job = client.open_job(job_name, [("w", 128, 0)], lr=1e-3)
    with pytest.raises(depot.UnavailableError) as error:
        depot.Engine(job, "cuda")
    message = str(error.value)
    assert "CUDA" in message
    job.close()


def on_two_ranks(loop):
    """Runs loop(rank) for ranks 0 and 1, each on a thread; fails with the
    errors they raised, or when one still runs after 120 s (a hang)."""
    import threading
    errors = []

    def run(rank):
        try:
            loop(rank)
        except Exception as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=run, args=(r,), daemon=True)
               for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a rank hangs"
    assert not errors, errors


def train_two_ranks(opts, models, inputs, targets):
    """Three steps of two ranks (threads), each on its half of every batch;
    returns each rank's parameters."""
    def rank_loop(rank):
        for s in range(3):
            opts[rank].zero_grad()
            loss_of(models[rank], inputs[s][rank::2],
                    targets[s][rank::2]).backward()
            opts[rank].step()

    on_two_ranks(rank_loop)
    return [[p.detach().clone() for p in m.parameters()] for m in models]


def two_workers(model, client, job_name, **options):
    """Two copies of `model`, each with the DepotOptimizer of one of the two
    workers of job `job_name` (host engine, lr 1e-2, weight decay 0.1,
    `options`): (models, opts)."""
    models = [copy.deepcopy(model) for _ in range(2)]
    opts = [DepotOptimizer(models[r].parameters(), client=client,
                           job_name=job_name, engine="host", lr=1e-2,
                           weight_decay=0.1, num_workers=2, worker_rank=r,
                           **options, **small_chunks())
            for r in range(2)]
    return models, opts


def test_two_workers_with_an_offload_fraction_equal_full_offload(client,
                                                                 job_name):
    """Two workers (nodes) that keep half the parameters' optimizer on their
    device: the servers sum those tensors' gradients over the workers and
    send the sums back (sum-only tensors), and each worker updates them.
    Bit for bit the same as two workers that offload everything."""
    model, inputs, targets = model_and_data()
    results = []
    for fraction in (1.0, 0.5):
        models, opts = two_workers(model, client, f"{job_name}-{fraction}",
                                   offload_fraction=fraction)
        if fraction < 1:
            assert opts[1].engine.device_tensors
        results.append(train_two_ranks(opts, models, inputs, targets))
        for o in opts:
            o.close()
    for r in range(2):
        assert_bitwise(results[1][r], results[0][0])


def test_two_workers_keeping_a_layer_only_some_use_equal_full_offload(
        client, job_name):
    """Every parameter's optimizer on the device (offload_fraction=0: the
    servers only sum), two workers, and a layer that one worker, the other
    or neither uses in a step: the servers say which tensors no worker has
    a gradient for, and a tensor one worker lacks is updated from the
    other's gradient. Bit for bit the two workers that offload everything."""
    torch.manual_seed(0)
    model = Branchy()
    results = []
    for fraction in (1.0, 0.0):
        models, opts = two_workers(model, client, f"{job_name}-{fraction}",
                                   offload_fraction=fraction,
                                   find_unused_parameters=True)

        def rank_loop(rank):
            gen = torch.Generator().manual_seed(rank)
            for s in range(6):
                opts[rank].zero_grad(set_to_none=True)
                x = torch.randn(4, 8, generator=gen)
                y = torch.randn(4, 2, generator=gen)
                # b: rank 0 at steps 0 and 3, rank 1 at 1 and 4, no one at
                # 2 and 5.
                out = models[rank](x, use_b=s % 3 == rank)
                ((out - y) ** 2).mean().backward()
                opts[rank].step()

        on_two_ranks(rank_loop)
        if fraction < 1:
            assert len(opts[0].engine.device_tensors) == 6
        results.append([[p.detach().clone() for p in m.parameters()]
                        for m in models])
        for o in opts:
            o.close()
    for r in range(2):
        assert_bitwise(results[1][r], results[0][0])


def node_of_two_ranks(model, client, job_name, **options):
    """Two copies of `model`, each with the DepotOptimizer of one of the two
    local ranks of one node (host engines made in two threads, one node id;
    lr 1e-2, chunks of 64, buckets of 2, `options`): (models, opts)."""
    node = depot.engine.unique_id("host")
    models = [copy.deepcopy(model) for _ in range(2)]
    opts = [None, None]

    def construct(rank):
        opts[rank] = DepotOptimizer(
            models[rank].parameters(), client=client, job_name=job_name,
            engine="host", lr=1e-2, local_rank=rank, local_ranks=2,
            node_id=node, chunk_elems=64, bucket_chunks=2, **options)

    # The ranks' engines meet in the node's collectives as they are made.
    on_two_ranks(construct)
    return models, opts


@pytest.mark.parametrize("overlap_backward", [True, False])
def test_node_of_two_local_ranks_equals_two_workers(client, job_name,
                                                    overlap_backward):
    """A node of two local ranks (host engines in two threads, one node id):
    the engines reduce-scatter each bucket inside the node and each rank
    sends its part; the servers see one worker. Bit for bit the same as two
    data-parallel workers that each send their whole gradient (the servers
    sum two workers in rank order in fp32, as the node's collective does).
    Also with the step begun at step() (overlap_backward=False)."""
    run = train_two_ranks
    model, inputs, targets = model_and_data()
    models, opts = node_of_two_ranks(model, client, job_name,
                                     overlap_backward=overlap_backward)
    got = run(opts, models, inputs, targets)

    ref_models = [copy.deepcopy(model) for _ in range(2)]
    ref_opts = [DepotOptimizer(ref_models[r].parameters(), client=client,
                               job_name=f"{job_name}-ref", lr=1e-2,
                               num_workers=2, worker_rank=r, chunk_elems=64)
                for r in range(2)]
    want = run(ref_opts, ref_models, inputs, targets)
    assert_bitwise(got[0], want[0])
    assert_bitwise(got[1], want[0])  # every rank holds the whole model
    for o in opts:
        o.close()


def test_node_of_two_local_ranks_with_an_offload_fraction_checkpoints(
        client, job_name):
    """A node of two local ranks keeping half the parameters' optimizer on
    the devices, each rank its own chunks' part: a read of the state before
    gather_state() raises, naming it; after gather_state() on both ranks
    (a collective), either rank's torch_state_dict() equals the fully
    offloaded node's bit for bit, and state_dict() on one rank, loaded by
    both ranks of a new node, continues bit for bit as the uninterrupted
    run."""
    model, inputs, targets = model_and_data()
    states = []
    for fraction in (1.0, 0.5):
        models, opts = node_of_two_ranks(model, client,
                                         f"{job_name}-{fraction}",
                                         weight_decay=0.1,
                                         offload_fraction=fraction)
        train_two_ranks(opts, models, inputs, targets)
        if fraction == 1.0:
            states.append(opts[0].torch_state_dict()["state"])
            for o in opts:
                o.close()
    assert opts[0].engine.device_tensors
    with pytest.raises(ValueError, match="gather_state"):
        opts[0].state_dict()
    with pytest.raises(ValueError, match="gather_state"):
        opts[1].state[next(models[1].parameters())]
    on_two_ranks(lambda rank: opts[rank].gather_state())
    for rank in range(2):
        got = opts[rank].torch_state_dict()["state"]
        assert got.keys() == states[0].keys()
        for index in got:
            for key in got[index]:
                assert_bitwise([torch.as_tensor(got[index][key])],
                               [torch.as_tensor(states[0][index][key])])
    saved_opt = opts[0].state_dict()
    saved_model = copy.deepcopy(models[0].state_dict())
    after = train_two_ranks(opts, models, inputs[2:], targets[2:])
    for o in opts:
        o.close()

    fresh = copy.deepcopy(model)
    fresh.load_state_dict(saved_model)
    loaded_models, loaded = node_of_two_ranks(
        fresh, client, f"{job_name}-loaded", weight_decay=0.1,
        offload_fraction=0.5)
    for o in loaded:
        o.load_state_dict(saved_opt)
    got = train_two_ranks(loaded, loaded_models, inputs[2:], targets[2:])
    for rank in range(2):
        assert_bitwise(got[rank], after[0])
    for o in loaded:
        o.close()


def test_node_rank_that_stops_fails_its_peer_and_the_node_resumes(
        client, job_name):
    """A local rank that stops stepping (its process died, or it hangs):
    the other rank's step() raises DeadlineExceededError once one of the
    node's collectives has waited collective_timeout_s (1 s here) for it,
    instead of waiting for ever; no rollback is tried (no server went
    back), and the error says every rank's engine must be made anew. Then
    the whole story: both trainers exit, and a new node on the same job
    with resume=True (as torchrun restarts the group) resumes at the
    servers' step and ends bit for bit as an uninterrupted node's run."""
    import time
    model, inputs, targets = model_and_data()
    models, opts = node_of_two_ranks(model, client, f"{job_name}-ref")
    want = train_two_ranks(opts, models, inputs, targets)[0]
    for o in opts:
        o.close()

    models, opts = node_of_two_ranks(
        model, client, job_name, engine_options={"collective_timeout_s": 1.0})
    weights = opts[0].engine.weights_address()
    span = range(weights, weights + opts[0].engine.padded_elems * 4)
    assert all(p.data_ptr() in span for p in models[0].parameters())

    def step(rank, s):
        opts[rank].zero_grad()
        loss_of(models[rank], inputs[s][rank::2],
                targets[s][rank::2]).backward()
        opts[rank].step()

    on_two_ranks(lambda rank: step(rank, 0))  # step 1; then rank 1 stops
    start = time.monotonic()
    with pytest.raises(depot.DeadlineExceededError,
                       match="collective timeout of 1.0 s.*made anew"):
        step(0, 1)
    assert 1.0 <= time.monotonic() - start < 30
    # No server went back, and the servers hold step 1 only.
    assert opts[0].job.reconcile() == (1, False)
    # Closing frees the engine all the same, and says why the weights may
    # not be the servers'.
    with pytest.raises(depot.DeadlineExceededError):
        opts[0].close()
    assert opts[0].engine is None
    assert not any(p.data_ptr() in span for p in models[0].parameters())
    # Rank 1 learns from the node's collective that rank 0 gave up (within
    # a poll of its own watch, though nothing of its own was waiting).
    deadline = time.monotonic() + 10
    with pytest.raises(depot.FailedPreconditionError,
                       match="local rank 0 aborted"):
        while time.monotonic() < deadline:
            opts[1].engine.check_node()
            time.sleep(0.05)
    with pytest.raises(depot.FailedPreconditionError):
        opts[1].close()

    # The group restarts: a new node of the same job resumes at step 1
    # (its parameters take the servers' weights of it), and steps 2 and 3
    # end as the uninterrupted run's.
    models, opts = node_of_two_ranks(model, client, job_name, resume=True)
    assert [o.resumed_step for o in opts] == [1, 1]
    on_two_ranks(lambda rank: [step(rank, s) for s in (1, 2)])
    for rank in range(2):
        assert_bitwise([p.detach() for p in models[rank].parameters()], want)
    for o in opts:
        o.close()


def test_node_id_over_torch_distributed():
    import socket

    import torch.distributed as dist
    with pytest.raises(RuntimeError, match="init_process_group"):
        depot.torch.node_id(device="host")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=0, world_size=1)
    try:
        made = depot.torch.node_id(device="host")
        assert isinstance(made, bytes) and len(made) == 128
        assert made != depot.torch.node_id(device="host")
    finally:
        dist.destroy_process_group()


def test_engine_add_param_group_says_the_job_opened_at_construction(
        client, job_name):
    model, _, _ = model_and_data()
    opt = DepotOptimizer(model.parameters(), client=client, job_name=job_name,
                         engine="host", **small_chunks())
    with pytest.raises(RuntimeError, match="to the constructor"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.ones(3))]})
    opt.close()


@pytest.mark.parametrize("read", ["wait_weights", "state_dict"])
def test_engine_attached_weights_are_waited_for_before_reads_outside_forward(
        client, job_name, read):
    """After step() with attach() the buckets' weights are waited for by the
    forward (on CUDA they are still being copied in): wait_weights(), and
    the model's state_dict() by itself, wait for all of them first, so that
    an EMA or a checkpoint reads the new weights."""
    model, inputs, targets = model_and_data()
    opt = DepotOptimizer(model.parameters(), client=client,
                         job_name=job_name, engine="host", lr=1e-2,
                         **small_chunks())
    opt.attach(model)
    opt.zero_grad()
    loss_of(model, inputs[0], targets[0]).backward()
    opt.step()
    assert opt._driver.pending_waits  # the forward would wait for them
    if read == "wait_weights":
        opt.wait_weights()
    else:
        model.state_dict()
    assert not opt._driver.pending_waits
    opt.close()
