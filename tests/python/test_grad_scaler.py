"""depot.GradScaler: the C++ scaler of a job's config, through the C API.
Updates are local (no step is run); the servers only open the jobs."""

import pytest

import depot


def open_job(client, job_name, **fields):
    return client.open_job(job_name, [("w", 16, 0)], **fields)


def test_dynamic_scale_follows_megatrons_hysteresis_and_growth(client,
                                                               job_name):
    job = open_job(client, job_name, grad_dtype="fp16", loss_scale=0.0,
                   initial_loss_scale=1024.0, min_loss_scale=256.0,
                   loss_scale_window=3, hysteresis=2)
    scaler = depot.GradScaler(job)
    scales = [scaler.scale]
    for found_inf in (True, True, True, True, False, False, False):
        scaler.update(found_inf)
        scales.append(scaler.scale)
    # Overflow 1 is absorbed by the hysteresis, 2 and 3 halve, 4 hits the
    # floor; three clean steps double it.
    assert scales == [1024.0, 1024.0, 512.0, 256.0, 256.0, 256.0, 256.0,
                      512.0]


def test_positive_loss_scale_is_constant(client, job_name):
    job = open_job(client, job_name, grad_dtype="fp16", loss_scale=8.0)
    scaler = depot.GradScaler(job)
    scaler.update(True)
    scaler.update(False)
    assert scaler.scale == 8.0


def test_fp32_gradients_without_a_scale_get_scale_one(client, job_name):
    job = open_job(client, job_name, loss_scale=0.0)
    assert depot.GradScaler(job).scale == 1.0


def test_state_dict_restores_the_trackers_into_a_new_scaler(client,
                                                            job_name):
    job = open_job(client, job_name, grad_dtype="fp16", loss_scale=0.0,
                   initial_loss_scale=1024.0, loss_scale_window=3,
                   hysteresis=2)
    scaler = depot.GradScaler(job)
    for found_inf in (True, False):
        scaler.update(found_inf)
    saved = scaler.state_dict()
    assert saved == {"scale": 1024.0, "growth_tracker": 1,
                     "hysteresis_tracker": 1}
    restored = depot.GradScaler(job)
    restored.load_state_dict(saved)
    for s in (scaler, restored):
        s.update(True)  # the hysteresis budget is spent: backs off
    assert restored.scale == scaler.scale == 512.0


def test_loading_a_state_that_does_not_fit_changes_nothing(client,
                                                           job_name):
    job = open_job(client, job_name, grad_dtype="fp16", loss_scale=0.0,
                   initial_loss_scale=1024.0, loss_scale_window=3)
    scaler = depot.GradScaler(job)
    before = scaler.state_dict()
    with pytest.raises(depot.InvalidArgumentError, match="growth_tracker"):
        scaler.load_state_dict({"scale": 8.0, "growth_tracker": 3,
                                "hysteresis_tracker": 2})
    assert scaler.state_dict() == before
