"""DepotOptimizer's handling of weights changed outside the optimizer
(noticed, warned about once, sent as the servers' master weights;
sync_weights), and of a step that waits for a worker that never comes
(step_timeout, and an error that names the missing rank, and the status
that says what a pending step waits for)."""

import time
import warnings

import numpy as np
import pytest
import torch

import depot
import training
from depot.torch import DepotOptimizer


def master_of(opt, param):
    """The servers' fp32 master weights of `param`."""
    index = next(i for i, p in enumerate(opt._all_params()) if p is param)
    begin = opt.job.tensor_offsets[index]
    return torch.from_numpy(opt.job.pull(begin, begin + param.numel()))


def test_an_edit_becomes_the_master_weights_with_one_warning(client,
                                                             job_name):
    model = training.make_model()
    opt = DepotOptimizer(model.parameters(), client=client, job_name=job_name,
                         optimizer="sgd", lr=0.0)
    inputs, targets = training.batch(0)
    training.train_step(model, opt, inputs, targets)
    with torch.no_grad():
        model[0].weight.mul_(2.0)
    with pytest.warns(UserWarning, match="changed outside the optimizer"):
        training.train_step(model, opt, inputs, targets)
    assert torch.equal(master_of(opt, model[0].weight),
                       model[0].weight.detach().reshape(-1))
    with torch.no_grad():
        model[0].bias.add_(1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once: no second warning
        training.train_step(model, opt, inputs, targets)
    assert torch.equal(master_of(opt, model[0].bias),
                       model[0].bias.detach().reshape(-1))


def test_sync_weights_sends_every_parameter(client, job_name):
    # bf16 weights on the wire: the fp32 parameters hold the bf16 rounding of
    # the fp32 master weights, so the master differs from them until synced.
    model = training.make_model()
    opt = DepotOptimizer(model.parameters(), client=client, job_name=job_name,
                         optimizer="sgd", lr=0.01, weight_dtype="bf16")
    inputs, targets = training.batch(0)
    training.train_step(model, opt, inputs, targets)
    weight = model[0].weight
    assert not torch.equal(master_of(opt, weight), weight.detach().reshape(-1))
    for group in opt.param_groups:
        group["lr"] = 0.0
    opt.sync_weights()
    training.train_step(model, opt, inputs, targets)
    assert torch.equal(master_of(opt, weight), weight.detach().reshape(-1))


def test_a_missing_worker_fails_the_step_naming_its_rank(servers, job_name):
    model = training.make_model()
    opt = DepotOptimizer(model.parameters(), servers=servers,
                         job_name=job_name, num_workers=2, worker_rank=0,
                         step_timeout=1.5)
    inputs, targets = training.batch(0)
    start = time.monotonic()
    with pytest.raises(depot.DeadlineExceededError,
                       match=r"worker rank 1 \(of 2\)") as caught:
        training.train_step(model, opt, inputs, targets)
    assert isinstance(caught.value, TimeoutError)
    assert time.monotonic() - start < 30


def test_step_timeout_with_a_given_client_is_refused(client, job_name):
    model = training.make_model()
    with pytest.raises(ValueError, match="step_timeout"):
        DepotOptimizer(model.parameters(), client=client, job_name=job_name,
                       step_timeout=5)


def test_status_names_the_workers_a_pending_step_waits_for(client, job_name):
    job = client.open_job(job_name, [("w", 8, 0)], num_workers=3,
                          worker_rank=0, optimizer="sgd", lr=0.1)
    job.init_weights(np.zeros(job.total_elems, dtype=np.float32))
    # Worker 0 sends step 1 with a short deadline; ranks 1 and 2 never do.
    short = depot.Client(client.servers, step_timeout=1.0)
    waiting = short.open_job(job_name, [("w", 8, 0)], num_workers=3,
                             worker_rank=0, optimizer="sgd", lr=0.1)
    grads = np.ones(job.total_elems, dtype=np.float32)
    with pytest.raises(depot.DeadlineExceededError):
        waiting.step(1, grads, np.zeros_like(grads))
    statuses = [s for s in job.status() if s.pending_step]
    assert statuses, "no server reports the pending step"
    for status in statuses:
        assert status.pending_step == 1
        assert status.missing_workers == (1, 2)
        assert status.waiting_seconds > 0
