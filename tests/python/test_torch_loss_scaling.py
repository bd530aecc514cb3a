"""DepotOptimizer's loss scaling: the dynamic scaler (the C++ one, through
the C API) with fp16 gradients, with torch GradScaler's defaults
(loss_scale="dynamic": 2**16, no hysteresis) or Megatron's
(loss_scale="megatron": 2**32, hysteresis 2), and a constant scale.

Starting at 2**32, this model's fp16 gradients overflow: every such step is
skipped with the parameters left unchanged, the first `hysteresis` overflows
keep the scale, each later one halves it, and once the scaled gradients fit
in fp16 the model trains.
"""

import pytest
import torch

import training
from depot.torch import DepotOptimizer

INITIAL_SCALE = 2.0 ** 32
MAX_STEPS = 60
# preset: its hysteresis (both run from INITIAL_SCALE here).
PRESETS = {"megatron": 2, "dynamic": 1}


def scaled_step(model, opt, inputs, targets):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(inputs), targets)
    opt.scale_loss(loss).backward()
    opt.step()
    return loss.item()


def expected_scale(overflows, hysteresis):
    """The scale after `overflows` consecutive overflowing steps."""
    return INITIAL_SCALE * 0.5 ** max(0, overflows - (hysteresis - 1))


def test_dynamic_presets_start_at_torch_and_megatron_defaults(client,
                                                              job_name):
    model = training.make_model()
    torch_like = DepotOptimizer(model.parameters(), client=client,
                                job_name=job_name, grad_dtype="fp16",
                                loss_scale="dynamic")
    assert torch_like.loss_scale == 2.0 ** 16
    megatron = DepotOptimizer(model.parameters(), client=client,
                              job_name=job_name + "-m", grad_dtype="fp16",
                              loss_scale="megatron")
    assert megatron.loss_scale == 2.0 ** 32


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_dynamic_scale_skips_overflows_backs_off_then_trains(client,
                                                              job_name,
                                                              preset):
    hysteresis = PRESETS[preset]
    model = training.make_model()
    opt = DepotOptimizer(model.parameters(), client=client,
                         job_name=job_name, lr=1e-2, grad_dtype="fp16",
                         loss_scale=preset, initial_loss_scale=INITIAL_SCALE,
                         chunk_elems=training.CHUNK_ELEMS)
    assert opt.loss_scale == INITIAL_SCALE
    inputs, targets = training.batch(0)
    overflows = 0
    while True:
        before = training.flat_weights(model)
        scale = opt.loss_scale
        loss = scaled_step(model, opt, inputs, targets)
        assert opt.last_step.loss_scale == scale
        if not opt.last_step.skipped:
            break
        overflows += 1
        assert opt.last_step.found_inf
        assert torch.equal(training.flat_weights(model), before), (
            f"a skipped step (overflow {overflows}) changed the parameters")
        assert opt.loss_scale == expected_scale(overflows, hysteresis)
        assert overflows < MAX_STEPS, "the scale never backed off enough"
    assert overflows > hysteresis
    assert not opt.last_step.found_inf
    assert not torch.equal(training.flat_weights(model), before)
    assert opt.loss_scale == scale  # grows only after loss_scale_window
    first_loss = loss
    for _ in range(10):
        loss = scaled_step(model, opt, inputs, targets)
        assert not opt.last_step.skipped
    assert loss < first_loss


def test_constant_loss_scale_trains_like_unscaled_sgd(client, job_name):
    depot_model = training.make_model()
    torch_model = training.twin(depot_model)
    depot_opt = DepotOptimizer(depot_model.parameters(), client=client,
                               job_name=job_name, optimizer="sgd", lr=0.05,
                               loss_scale=1024.0,
                               chunk_elems=training.CHUNK_ELEMS)
    torch_opt = torch.optim.SGD(torch_model.parameters(), lr=0.05)
    for step in range(5):
        inputs, targets = training.batch(step)
        scaled_step(depot_model, depot_opt, inputs, targets)
        training.train_step(torch_model, torch_opt, inputs, targets)
        assert depot_opt.loss_scale == 1024.0
    expected = training.flat_weights(torch_model)
    difference = (training.flat_weights(depot_model) - expected).abs()
    assert difference.max().item() <= 1e-5 * expected.abs().max().item()


def test_dynamic_scale_with_fp32_gradients_is_refused(client, job_name):
    model = training.make_model()
    with pytest.raises(ValueError, match="fp16"):
        DepotOptimizer(model.parameters(), client=client, job_name=job_name,
                       loss_scale="dynamic")


def test_without_loss_scaling_the_scale_is_one(client, job_name):
    model = training.make_model()
    opt = DepotOptimizer(model.parameters(), client=client,
                         job_name=job_name)
    assert opt.loss_scale == 1.0
    loss = torch.tensor(3.0)
    assert opt.scale_loss(loss).item() == 3.0


def test_state_dict_carries_the_dynamic_scale(client, job_name):
    model = training.make_model()
    opt = DepotOptimizer(model.parameters(), client=client,
                         job_name=job_name, lr=1e-2, grad_dtype="fp16",
                         loss_scale="megatron",
                         chunk_elems=training.CHUNK_ELEMS)
    inputs, targets = training.batch(0)
    for _ in range(PRESETS["megatron"] + 2):  # overflows: it backs off
        scaled_step(model, opt, inputs, targets)
    assert opt.loss_scale < INITIAL_SCALE
    saved = opt.state_dict()

    resumed_model = training.twin(model)
    resumed = DepotOptimizer(resumed_model.parameters(), client=client,
                             job_name=job_name + "-resumed", lr=1e-2,
                             grad_dtype="fp16", loss_scale="megatron",
                             chunk_elems=training.CHUNK_ELEMS)
    assert resumed.loss_scale == INITIAL_SCALE
    resumed.load_state_dict(saved)
    assert resumed.loss_scale == opt.loss_scale
    assert resumed.state_dict()["depot_grad_scaler"] == \
        saved["depot_grad_scaler"]
