"""DepotOptimizer(clip_grad=...) trains like torch.optim after
torch.nn.utils.clip_grad_norm_, and reports torch's total norm.

The clip bound is small against this model's gradients, so clipping is
active on most steps; the bounds are those of test_torch_parity.py (the
servers clip with the same coefficient, max_norm / (norm + 1e-6)). The norm
is compared on the Depot model's own gradients: torch sums the squares in
fp32, the servers in double, a few fp32 ulps apart, below 1e-6 relative.
"""

import math

import pytest
import torch

import training
from depot.torch import DepotOptimizer

STEPS = 30
CLIP_GRAD = 0.05
WEIGHT_TOLERANCE = 1e-5  # of the largest weight
NORM_TOLERANCE = 1e-6  # relative


@pytest.mark.parametrize("norm_type", [2, math.inf], ids=["l2", "inf"])
def test_clipped_training_matches_torch_clip_grad_norm(client, job_name,
                                                       norm_type):
    hparams = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)
    depot_model = training.make_model()
    torch_model = training.twin(depot_model)
    depot_opt = DepotOptimizer(
        training.param_groups(depot_model, 0.1), client=client,
        job_name=job_name, chunk_elems=training.CHUNK_ELEMS,
        clip_grad=CLIP_GRAD, clip_grad_norm_type=norm_type, **hparams)
    torch_opt = torch.optim.AdamW(training.param_groups(torch_model, 0.1),
                                  **hparams)
    clipped_steps = 0
    for step in range(STEPS):
        inputs, targets = training.batch(step)
        for model in (depot_model, torch_model):
            model.zero_grad()
            torch.nn.functional.mse_loss(model(inputs), targets).backward()
        # Measures the Depot model's own gradients: with an infinite bound
        # clip_grad_norm_ multiplies them by exactly 1.
        depot_norm = torch.nn.utils.clip_grad_norm_(
            depot_model.parameters(), math.inf, norm_type).item()
        torch.nn.utils.clip_grad_norm_(torch_model.parameters(), CLIP_GRAD,
                                       norm_type)
        depot_opt.step()
        torch_opt.step()

        last = depot_opt.last_step
        assert not last.skipped and not last.found_inf
        assert last.grad_norm == pytest.approx(depot_norm,
                                               rel=NORM_TOLERANCE), (
            f"step {step + 1}")
        expected_coef = min(1.0, CLIP_GRAD / (depot_norm + 1e-6))
        assert last.clip_coef == pytest.approx(expected_coef, rel=1e-5)
        clipped_steps += last.clip_coef < 1.0
        expected = training.flat_weights(torch_model)
        difference = (training.flat_weights(depot_model) - expected).abs()
        bound = WEIGHT_TOLERANCE * expected.abs().max().item()
        assert difference.max().item() <= bound, (
            f"step {step + 1}: largest weight difference "
            f"{difference.max().item():.3g} > {bound:.3g}")
    assert clipped_steps >= STEPS * 2 // 3


def test_negative_clip_grad_is_refused(client, job_name):
    model = training.make_model()
    with pytest.raises(ValueError, match="clip_grad"):
        DepotOptimizer(model.parameters(), client=client, job_name=job_name,
                       clip_grad=-1.0)


def test_unknown_clip_norm_type_is_refused(client, job_name):
    model = training.make_model()
    with pytest.raises(ValueError, match="clip_grad_norm_type"):
        DepotOptimizer(model.parameters(), client=client, job_name=job_name,
                       clip_grad=1.0, clip_grad_norm_type=1)
