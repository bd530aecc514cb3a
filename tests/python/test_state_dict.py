"""Saving and restoring the servers' optimizer state: Job.save_state /
load_state and DepotOptimizer.state_dict / load_state_dict."""

import io

import numpy as np
import pytest
import torch

import depot
import training
from depot.torch import DepotOptimizer

SAVE_AT = 10
STEPS = 20


def make(client, job_name):
    model = training.make_model()
    opt = DepotOptimizer(training.param_groups(model, weight_decay=0.1),
                         client=client, job_name=job_name, optimizer="adamw",
                         lr=0.01, chunk_elems=training.CHUNK_ELEMS)
    return model, opt


def run(model, opt, first, last):
    for step in range(first, last + 1):
        training.train_step(model, opt, *training.batch(step))


def test_resumed_optimizer_matches_uninterrupted_training_bit_for_bit(
        client, job_name):
    whole_model, whole_opt = make(client, job_name + "-whole")
    run(whole_model, whole_opt, 1, STEPS)

    model, opt = make(client, job_name + "-first")
    run(model, opt, 1, SAVE_AT)
    checkpoint = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()},
               checkpoint)
    checkpoint.seek(0)

    loaded = torch.load(checkpoint)
    resumed_model, resumed_opt = make(client, job_name + "-resumed")
    resumed_model.load_state_dict(loaded["model"])
    resumed_opt.load_state_dict(loaded["opt"])
    run(resumed_model, resumed_opt, SAVE_AT + 1, STEPS)

    assert resumed_opt.last_result.step == STEPS
    for got, want in zip(resumed_model.parameters(),
                         whole_model.parameters()):
        assert torch.equal(got, want)
    assert np.array_equal(resumed_opt.job.pull(), whole_opt.job.pull())


def test_state_dict_keeps_torchs_keys_and_adds_the_depot_state(client,
                                                               job_name):
    model, opt = make(client, job_name)
    run(model, opt, 1, 2)
    state = opt.state_dict()
    assert len(state["param_groups"]) == 2
    assert state["depot_state"].dtype == torch.uint8
    assert state["depot_step"] == 2
    assert state["depot_grad_scaler"]["scale"] == 1.0


def test_state_dict_before_the_first_step_has_no_depot_state(client,
                                                             job_name):
    _, opt = make(client, job_name)
    assert opt.state_dict()["depot_state"] is None


def test_load_state_dict_with_part_of_depot_keys_is_a_key_error(client,
                                                                job_name):
    _, opt = make(client, job_name)
    with pytest.raises(KeyError, match="depot_state"):
        opt.load_state_dict({"state": {}, "param_groups": [],
                             "depot_step": 3})


def test_torch_state_dict_of_another_shape_is_a_value_error(client,
                                                            job_name):
    _, opt = make(client, job_name)
    with pytest.raises(ValueError, match="param groups do not match"):
        opt.load_state_dict({"state": {}, "param_groups": []})


def test_corrupt_job_state_is_data_loss_and_changes_nothing(client,
                                                            job_name):
    model, opt = make(client, job_name)
    run(model, opt, 1, 3)
    blob = bytearray(opt.job.save_state())
    blob[len(blob) // 2] ^= 0x01
    before = checksums(opt.job)
    with pytest.raises(depot.DataLossError):
        opt.job.load_state(bytes(blob))
    after = checksums(opt.job)
    assert after == before


def test_saved_state_is_the_library_buffer_and_loads_from_any_byte_buffer(
        client, job_name):
    """save_state_array() is a view of the library's buffer (no copy), and
    load_state reads bytes, bytearray, memoryview, arrays and tensors in
    place; each returns the job to the saved state."""
    model, opt = make(client, job_name)
    run(model, opt, 1, 1)
    earlier = opt.job.save_state()
    run(model, opt, 2, 2)
    array = opt.job.save_state_array()
    assert array.dtype == np.uint8 and not array.flags.owndata
    assert opt.job.save_state() == array.tobytes()
    saved = checksums(opt.job)
    for state in (array.tobytes(), bytearray(array), memoryview(array),
                  array, torch.from_numpy(array)):
        opt.job.load_state(earlier)
        assert checksums(opt.job) != saved
        opt.job.load_state(state)
        assert checksums(opt.job) == saved
    with pytest.raises(ValueError, match="uint8"):
        opt.job.load_state(torch.zeros(4))
    with pytest.raises(TypeError, match="bytes"):
        opt.job.load_state("state")


def checksums(job):
    return [s.state_checksum for s in job.status(with_checksum=True)]
