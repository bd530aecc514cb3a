"""Two trainer processes (W = 2), each on half of every batch, train the
weights that one process gets on the whole batch.

The convention under test: the servers SUM the workers' gradients, so each
worker divides its local mean loss by W (data_parallel_worker.py); the sum is
then the gradient of the mean over the global batch. The two gradients are
not bitwise equal (torch reduces over 16 rows in one product, the two
workers over 8 rows each, then the servers add), so the trajectories agree
to fp32 rounding: within the parity tests' bound of 1e-5 of the largest
weight. Both workers receive the very same weights from the servers:
bitwise.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

import data_parallel_worker
import server_process
from conftest import PACKAGE_DIR, TESTS_DIR

WEIGHT_TOLERANCE = 1e-5  # of the largest weight
WORKER_TIMEOUT_SECONDS = 120  # a backstop, below ctest's timeout


def run_workers(servers, job_name, optimizer, out_dir, num_workers):
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(
        [str(PACKAGE_DIR), str(TESTS_DIR), environment.get("PYTHONPATH", "")])
    workers, outputs = [], []
    for rank in range(num_workers):
        outputs.append(os.path.join(out_dir, f"worker{rank}.npy"))
        workers.append(subprocess.Popen(
            [sys.executable, str(TESTS_DIR / "data_parallel_worker.py"),
             f"--servers={','.join(servers)}", f"--job_name={job_name}",
             f"--num_workers={num_workers}", f"--worker_rank={rank}",
             f"--optimizer={optimizer}", f"--out={outputs[-1]}"],
            env=environment, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True,
            preexec_fn=server_process.die_with_parent))
    failures = []
    for rank, worker in enumerate(workers):
        try:
            log, _ = worker.communicate(timeout=WORKER_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            worker.kill()
            log, _ = worker.communicate()
        if worker.returncode != 0:
            failures.append(
                f"worker {rank} exited {worker.returncode}:\n{log}")
    assert not failures, "\n".join(failures)
    return [np.load(path) for path in outputs]


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_two_workers_on_half_batches_match_one_on_the_whole(
        servers, client, job_name, tmp_path, optimizer):
    worker0, worker1 = run_workers(servers, job_name + "-w2", optimizer,
                                   str(tmp_path), num_workers=2)
    whole = data_parallel_worker.train(servers, job_name + "-w1", 1, 0,
                                       optimizer, client=client)

    np.testing.assert_array_equal(worker0, worker1)
    for step, (two, one) in enumerate(zip(worker0, whole), start=1):
        bound = WEIGHT_TOLERANCE * np.abs(one).max()
        difference = np.abs(two - one).max()
        assert difference <= bound, (
            f"step {step}: W=2 differs from W=1 by {difference:.3g} > "
            f"{bound:.3g}")
