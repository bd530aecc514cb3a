"""DepotOptimizer's behaviour besides parity: what it refuses, frozen
parameters, closures."""

import pytest
import torch

import training
from depot.torch import DepotOptimizer


def make(client, job_name, params=None, **kwargs):
    model = training.make_model()
    opt = DepotOptimizer(model.parameters() if params is None else params,
                         client=client, job_name=job_name,
                         chunk_elems=training.CHUNK_ELEMS, **kwargs)
    return model, opt


def test_groups_with_different_betas_are_refused(client, job_name):
    model = training.make_model()
    groups = [{"params": [model[0].weight], "betas": (0.8, 0.9)},
              {"params": [model[0].bias]}]
    with pytest.raises(ValueError, match="betas"):
        DepotOptimizer(groups, client=client, job_name=job_name)


def test_changing_momentum_during_training_is_refused(client, job_name):
    model, opt = make(client, job_name, optimizer="sgd", lr=0.1,
                      momentum=0.9)
    opt.param_groups[0]["momentum"] = 0.5
    inputs, targets = training.batch(0)
    with pytest.raises(ValueError, match="momentum"):
        training.train_step(model, opt, inputs, targets)


def test_add_param_group_after_construction_is_not_implemented(client,
                                                               job_name):
    _, opt = make(client, job_name)
    with pytest.raises(NotImplementedError, match="layout is fixed"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.ones(3))]})


def test_frozen_parameters_are_left_out_and_unchanged(client, job_name):
    model = training.make_model()
    model[0].weight.requires_grad_(False)
    frozen = model[0].weight.clone()
    opt = DepotOptimizer(model.parameters(), client=client,
                         job_name=job_name, weight_decay=0.5)
    before = model[2].weight.clone()
    inputs, targets = training.batch(0)
    training.train_step(model, opt, inputs, targets)
    assert len(opt.job.tensors) == 3
    assert torch.equal(model[0].weight, frozen)
    assert not torch.equal(model[2].weight, before)


def test_step_returns_the_closures_loss(client, job_name):
    model, opt = make(client, job_name)
    inputs, targets = training.batch(0)
    losses = []

    def closure():
        opt.zero_grad()
        losses.append(torch.nn.functional.mse_loss(model(inputs), targets))
        losses[-1].backward()
        return losses[-1]

    assert opt.step(closure) is losses[0]
    assert len(losses) == 1
    assert opt.last_result.step == 1
