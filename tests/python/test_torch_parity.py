"""DepotOptimizer trains exactly like the torch.optim optimizer it replaces:
the same model and data, two param groups (no decay on biases), a LambdaLR
schedule, 50 steps. At every step the largest weight difference is at most
1e-5 of the largest weight, and the losses agree to 5 significant digits.

Why these bounds hold: the servers implement torch.optim's update in fp32
(docs/optimizers.md), so the two runs differ only by fp32 rounding where the
order of operations differs, a few ulps per step, far below 1e-5 relative.
"""

import math

import pytest
import torch

import training
from depot.torch import DepotOptimizer

WEIGHT_TOLERANCE = 1e-5  # of the largest weight
LOSS_DIGITS = 5

CASES = {
    "adamw": (torch.optim.AdamW,
              dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)),
    "adam": (torch.optim.Adam,
             dict(lr=1e-2, betas=(0.8, 0.999), eps=1e-6, weight_decay=0.01)),
    "sgd": (torch.optim.SGD,
            dict(lr=0.05, momentum=0.9, weight_decay=1e-3)),
    "sgd_nesterov": (torch.optim.SGD,
                     dict(lr=0.05, momentum=0.9, nesterov=True,
                          weight_decay=1e-3)),
    "sgd_dampening": (torch.optim.SGD,
                      dict(lr=0.05, momentum=0.8, dampening=0.3,
                           weight_decay=1e-3)),
}


def agree_to_significant_digits(a, b, digits):
    """|a - b| is at most half a unit in the `digits`-th significant digit
    of b."""
    if b == 0:
        return a == 0
    unit = 10.0 ** (math.floor(math.log10(abs(b))) - (digits - 1))
    return abs(a - b) <= 0.5 * unit


@pytest.mark.parametrize("case", sorted(CASES))
def test_depot_optimizer_matches_torch_optim_for_50_steps(client, job_name,
                                                           case):
    torch_optimizer, hparams = CASES[case]
    kind = case.split("_")[0]
    depot_model = training.make_model()
    torch_model = training.twin(depot_model)
    weight_decay = hparams["weight_decay"]
    depot_opt = DepotOptimizer(
        training.param_groups(depot_model, weight_decay), client=client,
        job_name=job_name, optimizer=kind,
        chunk_elems=training.CHUNK_ELEMS, **hparams)
    torch_opt = torch_optimizer(
        training.param_groups(torch_model, weight_decay), **hparams)
    depot_schedule = torch.optim.lr_scheduler.LambdaLR(
        depot_opt, training.lr_lambda)
    torch_schedule = torch.optim.lr_scheduler.LambdaLR(
        torch_opt, training.lr_lambda)

    for step in range(training.STEPS):
        inputs, targets = training.batch(step)
        depot_loss = training.train_step(depot_model, depot_opt, inputs,
                                         targets)
        torch_loss = training.train_step(torch_model, torch_opt, inputs,
                                         targets)
        depot_schedule.step()
        torch_schedule.step()

        assert agree_to_significant_digits(depot_loss, torch_loss,
                                           LOSS_DIGITS), (
            f"step {step + 1}: loss {depot_loss!r} vs torch {torch_loss!r}")
        expected = training.flat_weights(torch_model)
        difference = (training.flat_weights(depot_model) - expected).abs()
        bound = WEIGHT_TOLERANCE * expected.abs().max().item()
        assert difference.max().item() <= bound, (
            f"step {step + 1}: largest weight difference "
            f"{difference.max().item():.3g} > {bound:.3g}")
    assert depot_opt.last_result.step == training.STEPS
