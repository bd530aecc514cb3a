"""Failures surface as depot.DepotError subclasses chosen by the status code,
carrying the server's (or the library's) message."""

import numpy as np
import pytest

import depot
import training
from depot.torch import DepotOptimizer

TENSORS = [("w", 300, 0), ("b", 20, 1)]


def open_job(client, name, **fields):
    return client.open_job(name, TENSORS, chunk_elems=64, **fields)


def zeros(job):
    return np.zeros(job.total_elems, dtype=np.float32)


def test_unknown_job_raises_not_found_with_the_servers_message(client,
                                                               job_name):
    job = open_job(client, job_name)
    job.delete()
    with pytest.raises(depot.NotFoundError) as error:
        job.status()
    assert error.value.code == 5
    assert error.value.code_name == "NOT_FOUND"
    assert "not found" in error.value.message
    assert any(server in error.value.message for server in client.servers)


def test_attach_with_another_config_raises_failed_precondition(client,
                                                               job_name):
    open_job(client, job_name, lr=1e-3)
    with pytest.raises(depot.FailedPreconditionError,
                       match="already exists .* different config: "
                             r"optimizer.lr: 0.001 \(existing job\) vs "
                             r"0.002 \(this request\)"):
        open_job(client, job_name, lr=2e-3)


def test_step_out_of_order_raises_aborted(client, job_name):
    job = open_job(client, job_name)
    job.init_weights(zeros(job))
    with pytest.raises(depot.AbortedError, match="step 3"):
        job.step(3, zeros(job), zeros(job))


def test_invalid_config_raises_invalid_argument_naming_the_field(client,
                                                                 job_name):
    with pytest.raises(depot.InvalidArgumentError, match="adam_beta1"):
        open_job(client, job_name, adam_beta1=1.5)


def test_worker_rank_not_below_num_workers_raises_invalid_argument(
        client, job_name):
    with pytest.raises(depot.InvalidArgumentError, match="worker_rank 2"):
        open_job(client, job_name, num_workers=2, worker_rank=2)


def test_pull_outside_the_job_raises_out_of_range(client, job_name):
    job = open_job(client, job_name)
    with pytest.raises(depot.OutOfRangeError):
        job.pull(0, job.total_elems + 1,
                 out=np.zeros(job.total_elems + 1, dtype=np.float32))


def test_unreachable_server_raises_unavailable_naming_it():
    client = depot.Client(["127.0.0.1:1"])
    with pytest.raises(depot.UnavailableError, match="127.0.0.1:1"):
        client.wait_for_servers(timeout=0.5)


def test_optimizer_on_another_runs_job_name_raises_failed_precondition(
        client, job_name):
    def optimizer(lr):
        model = training.make_model()
        return DepotOptimizer(model.parameters(), client=client,
                              job_name=job_name, lr=lr)

    optimizer(1e-3).job  # the job is opened on first use
    with pytest.raises(depot.FailedPreconditionError,
                       match="different config"):
        optimizer(2e-3).job


def test_optimizer_on_a_trained_job_raises_failed_precondition(client,
                                                               job_name):
    def run():
        model = training.make_model()
        opt = DepotOptimizer(model.parameters(), client=client,
                             job_name=job_name)
        inputs, targets = training.batch(0)
        training.train_step(model, opt, inputs, targets)

    run()
    with pytest.raises(depot.FailedPreconditionError,
                       match="already been trained to step 1"):
        run()


# Each error is also the built-in exception generic Python code catches for
# that kind of failure (depot/errors.py has the table and the reasons).
BUILTIN_BASES = [
    (depot.InvalidArgumentError, ValueError),
    (depot.OutOfRangeError, IndexError),
    (depot.NotFoundError, LookupError),
    (depot.DeadlineExceededError, TimeoutError),
    (depot.PermissionDeniedError, PermissionError),
    (depot.UnauthenticatedError, PermissionError),
    (depot.UnavailableError, ConnectionError),
    (depot.UnimplementedError, NotImplementedError),
    (depot.FailedPreconditionError, RuntimeError),
    (depot.AbortedError, RuntimeError),
    (depot.ResourceExhaustedError, RuntimeError),
]


@pytest.mark.parametrize("error_class, builtin", BUILTIN_BASES,
                         ids=[cls.__name__ for cls, _ in BUILTIN_BASES])
def test_error_for_a_code_is_caught_as_the_matching_builtin(error_class,
                                                            builtin):
    with pytest.raises(builtin) as caught:
        raise depot.error_for_code(error_class.code, "the message")
    assert type(caught.value) is error_class
    assert isinstance(caught.value, depot.DepotError)


@pytest.mark.parametrize("error_class", [
    depot.CancelledError, depot.UnknownError, depot.AlreadyExistsError,
    depot.InternalError, depot.DataLossError])
def test_codes_without_a_builtin_counterpart_are_only_depot_errors(
        error_class):
    assert error_class.__mro__[1:] == (depot.DepotError, Exception,
                                       BaseException, object)


def test_resource_exhausted_is_not_a_memory_error():
    # MemoryError means this process ran out of memory; this is a server's
    # budget.
    assert not issubclass(depot.ResourceExhaustedError, MemoryError)


def test_an_os_error_based_error_keeps_its_code_message_and_text():
    error = depot.error_for_code(depot.UnavailableError.code, "server down")
    assert isinstance(error, OSError)
    assert (error.code, error.code_name, error.message) == (
        14, "UNAVAILABLE", "server down")
    assert str(error) == "UNAVAILABLE: server down"
    assert error.args == ("server down",)


def test_pull_outside_the_job_is_an_index_error(client, job_name):
    job = open_job(client, job_name)
    with pytest.raises(IndexError):
        job.pull(0, job.total_elems + 1,
                 out=np.zeros(job.total_elems + 1, dtype=np.float32))


def test_unreachable_server_is_a_connection_error():
    client = depot.Client(["127.0.0.1:1"])
    with pytest.raises(ConnectionError, match="127.0.0.1:1"):
        client.wait_for_servers(timeout=0.5)
