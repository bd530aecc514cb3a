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


def test_changing_betas_after_the_first_step_is_refused(client, job_name):
    model, opt = make(client, job_name, optimizer="adam")
    inputs, targets = training.batch(0)
    training.train_step(model, opt, inputs, targets)
    opt.param_groups[0]["betas"] = (0.8, 0.9)
    with pytest.raises(ValueError, match="betas"):
        training.train_step(model, opt, inputs, targets)


def test_changing_momentum_during_training_is_refused(client, job_name):
    model, opt = make(client, job_name, optimizer="sgd", lr=0.1,
                      momentum=0.9)
    inputs, targets = training.batch(0)
    training.train_step(model, opt, inputs, targets)
    opt.param_groups[0]["momentum"] = 0.5
    with pytest.raises(ValueError, match="momentum"):
        training.train_step(model, opt, inputs, targets)


def test_add_param_group_after_the_first_step_is_refused(client, job_name):
    model, opt = make(client, job_name)
    inputs, targets = training.batch(0)
    training.train_step(model, opt, inputs, targets)
    with pytest.raises(RuntimeError, match="before the first step"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.ones(3))]})


def test_add_param_group_before_the_first_step_trains_it(client, job_name):
    model, opt = make(client, job_name)
    extra = torch.nn.Parameter(torch.ones(3))
    opt.add_param_group({"params": [extra], "lr": 0.1})
    extra.grad = torch.ones(3)
    opt.step()
    assert len(opt.job.tensors) == 5
    assert not torch.equal(extra, torch.ones(3))


def test_frozen_parameters_are_in_the_job_and_unchanged(client, job_name):
    model = training.make_model()
    model[0].weight.requires_grad_(False)
    frozen = model[0].weight.clone()
    opt = DepotOptimizer(model.parameters(), client=client,
                         job_name=job_name, weight_decay=0.5)
    before = model[2].weight.clone()
    inputs, targets = training.batch(0)
    training.train_step(model, opt, inputs, targets)
    assert len(opt.job.tensors) == 4
    assert torch.equal(model[0].weight, frozen)
    assert not torch.equal(model[2].weight, before)
    assert opt.state[model[0].weight] == {}
    assert int(opt.state[model[2].weight]["step"]) == 1


def test_constructor_takes_what_torch_takes(client, job_name):
    model = training.make_model()
    with pytest.raises(TypeError, match="momentum"):
        DepotOptimizer(model.parameters(), client=client, job_name=job_name,
                       optimizer="adamw", momentum=0.9)
    with pytest.raises(ValueError, match="Invalid beta"):
        DepotOptimizer(model.parameters(), client=client, job_name=job_name,
                       optimizer="adam", betas=(1.5, 0.9))
    with pytest.raises(ValueError, match="differentiable"):
        DepotOptimizer(model.parameters(), client=client, job_name=job_name,
                       optimizer="adam", differentiable=True)
    # Accepted as torch accepts them on a CPU tensor: no-ops for Depot.
    DepotOptimizer(model.parameters(), client=client, job_name=job_name,
                   optimizer="adam", foreach=True)
    probe = torch.zeros(1, requires_grad=True)
    probe.grad = torch.zeros(1)
    with pytest.raises(AssertionError, match="capturable"):
        torch.optim.Adam([probe], capturable=True).step()  # torch, here
    with pytest.raises(AssertionError, match="capturable"):
        DepotOptimizer(model.parameters(), client=client, job_name=job_name,
                       optimizer="adam", capturable=True)


def test_float64_parameters_are_refused(client, job_name):
    model = training.make_model().double()
    with pytest.raises(TypeError, match="float64"):
        DepotOptimizer(model.parameters(), client=client, job_name=job_name)


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


def test_sgd_lr_may_come_from_the_groups_alone(client, job_name):
    model = training.make_model()
    groups = [{"params": list(model.parameters()), "lr": 0.1}]
    torch.optim.SGD(groups)  # torch accepts this
    DepotOptimizer(groups, client=client, job_name=job_name, optimizer="sgd")
    with pytest.raises(ValueError, match="required optimization parameter lr"):
        DepotOptimizer(model.parameters(), client=client, job_name=job_name,
                       optimizer="sgd")


def test_retain_transport_buffers_beside_a_client_is_refused(client,
                                                             job_name):
    # It would tune the client DepotOptimizer creates; one was given.
    with pytest.raises(ValueError, match="retain_transport_buffers"):
        make(client, job_name, retain_transport_buffers=True)
