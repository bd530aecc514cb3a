"""depot.Client and depot.Job: buffers passed by pointer, checked before
use; pull and status; finding the library."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import depot
from depot import _loader

TENSORS = [("w", 300, 0), ("b", 20, 1)]
LR = 0.5


@pytest.fixture
def job(client, job_name):
    """Plain SGD (lr 0.5, no momentum or decay): weights - 0.5 * grads."""
    job = client.open_job(job_name, TENSORS, optimizer="sgd", lr=LR,
                          weight_decay=0.0, sgd_momentum=0.0, chunk_elems=64)
    job.init_weights(np.ones(job.total_elems, dtype=np.float32))
    return job


def in_tensors(job, flat):
    """The elements of `flat` that belong to tensors (padding left out)."""
    return np.concatenate([
        flat[offset:offset + tensor.numel]
        for offset, tensor in zip(job.tensor_offsets, job.tensors)])


def test_layout_spreads_over_both_servers(job):
    assert job.tensor_offsets == [0, 320]
    assert job.total_elems == 384
    assert job.num_servers == 2
    assert all(s.shard_end > s.shard_begin for s in job.status())


def test_step_writes_into_the_numpy_array_passed(job):
    grads = np.full(job.total_elems, 2.0, dtype=np.float32)
    weights = np.zeros(job.total_elems, dtype=np.float32)
    result = job.step(1, grads, weights)
    assert np.all(in_tensors(job, weights) == 1.0 - LR * 2.0)
    assert result.step == 1
    assert result.bytes_sent == 4 * job.total_elems


def test_step_writes_into_the_torch_tensor_passed(job):
    grads = torch.full((job.total_elems,), 2.0)
    weights = torch.zeros(job.total_elems)
    address = weights.data_ptr()
    job.step(1, grads, weights)
    assert weights.data_ptr() == address
    assert torch.all(torch.from_numpy(
        in_tensors(job, weights.numpy())) == 1.0 - LR * 2.0)


def test_pull_returns_the_master_weights(job):
    job.step(1, np.full(job.total_elems, 2.0, dtype=np.float32),
             np.zeros(job.total_elems, dtype=np.float32))
    master = job.pull()
    assert master.dtype == np.float32
    assert np.all(in_tensors(job, master) == 1.0 - LR * 2.0)
    assert job.pull(320, 340).shape == (20,)


def test_pull_at_a_step_reads_it_until_the_servers_are_two_past_it(job):
    grads = np.full(job.total_elems, 2.0, dtype=np.float32)
    weights = np.zeros(job.total_elems, dtype=np.float32)
    job.step(1, grads, weights)
    at_1 = job.pull()
    job.step(2, grads, weights)
    assert not np.array_equal(job.pull(), at_1)
    # fp32 weights are the masters: the step before is exact in any dtype.
    assert np.array_equal(job.pull(step=1), at_1)
    assert np.array_equal(job.pull(step=2), job.pull())
    with pytest.raises(depot.FailedPreconditionError,
                       match="step 3 has not been applied yet"):
        job.pull(step=3)
    job.step(3, grads, weights)
    with pytest.raises(depot.FailedPreconditionError,
                       match="step 1 is no longer held"):
        job.pull(step=1)


def test_status_reports_the_applied_step_on_every_server(job):
    job.step(1, np.zeros(job.total_elems, dtype=np.float32),
             np.zeros(job.total_elems, dtype=np.float32))
    statuses = job.status(with_checksum=True)
    assert [s.step for s in statuses] == [1, 1]
    assert all(s.state_checksum != 0 for s in statuses)


def test_bf16_jobs_take_bfloat16_tensors(client, job_name):
    job = client.open_job(job_name, TENSORS, optimizer="sgd", lr=LR,
                          weight_decay=0.0, sgd_momentum=0.0,
                          grad_dtype="bf16", weight_dtype="bf16",
                          chunk_elems=64)
    job.init_weights(torch.ones(job.total_elems, dtype=torch.bfloat16))
    weights = torch.zeros(job.total_elems, dtype=torch.bfloat16)
    job.step(1, torch.full((job.total_elems,), 2.0, dtype=torch.bfloat16),
             weights)
    assert weights[0].item() == 0.0 and weights[320].item() == 0.0


@pytest.mark.parametrize("bad, error, message", [
    (np.zeros(384, dtype=np.float64), ValueError, "dtype float64"),
    (np.zeros(383, dtype=np.float32), ValueError, "383 elements"),
    (np.zeros(768, dtype=np.float32)[::2], ValueError, "not C-contiguous"),
    (torch.zeros(384, 2)[:, 0], ValueError, "not contiguous"),
    (torch.zeros(384, dtype=torch.float16), ValueError, "torch.float16"),
    ([0.0] * 384, TypeError, "NumPy array or a torch tensor"),
])
def test_bad_buffers_are_refused_before_any_call(job, bad, error, message):
    weights = np.zeros(job.total_elems, dtype=np.float32)
    with pytest.raises(error, match=message):
        job.step(1, bad, weights)
    with pytest.raises(error, match=message):
        job.step(1, weights.copy(), bad)
    assert [s.step for s in job.status()] == [0, 0]


def test_read_only_output_is_refused(job):
    weights = np.zeros(job.total_elems, dtype=np.float32)
    weights.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        job.step(1, np.zeros_like(weights), weights)


def test_unknown_optimizer_field_is_a_type_error(client, job_name):
    with pytest.raises(TypeError, match="adam_beta3"):
        client.open_job(job_name, TENSORS, adam_beta3=0.5)


def test_missing_library_error_says_how_to_point_at_it(tmp_path):
    missing = str(tmp_path / "libdepot_client.so")
    with pytest.raises(depot.LibraryNotFoundError,
                       match="DEPOT_CLIENT_LIBRARY"):
        _loader.load_library({_loader.LIBRARY_ENV: missing})



# In a fresh interpreter: whether glibc malloc serves a 16 MiB block with a
# mapping of its own (its default) after a depot.Client is created with the
# argument given (Depot's threshold, 32 MiB, keeps it in a heap).
_MAPPED_AFTER_CLIENT = """
import ctypes, json, sys
import depot
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
        "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
depot.Client(["127.0.0.1:1"], **json.loads(sys.argv[1]))
before = libc.mallinfo2().hblks
block = libc.malloc(16 << 20)
print(libc.mallinfo2().hblks > before)
libc.free(block)
"""


@pytest.mark.parametrize("kwargs, mapped", [
    ("{}", True), ('{"retain_transport_buffers": false}', True),
    ('{"retain_transport_buffers": true}', False)])
def test_client_tunes_malloc_only_when_asked(kwargs, mapped):
    env = {k: v for k, v in os.environ.items()
           if k not in ("GLIBC_TUNABLES", "MALLOC_MMAP_THRESHOLD_",
                        "MALLOC_TRIM_THRESHOLD_")}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    out = subprocess.run([sys.executable, "-c", _MAPPED_AFTER_CLIENT,
                          kwargs], env=env, check=True, capture_output=True,
                         text=True).stdout.strip()
    assert out == str(mapped)


def test_retain_transport_buffers_must_be_a_bool():
    with pytest.raises(TypeError, match="retain_transport_buffers"):
        depot.Client(["127.0.0.1:1"], retain_transport_buffers="yes")
