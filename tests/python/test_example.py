"""client/examples/train_torch.py runs against real servers and its loss
falls (it exits non-zero otherwise)."""

import os
import subprocess
import sys

from conftest import REPO_ROOT
import server_process

EXAMPLE = REPO_ROOT / "client" / "examples" / "train_torch.py"


def test_train_torch_example_trains_with_two_workers(servers, job_name):
    workers = [subprocess.Popen(
        [sys.executable, str(EXAMPLE), f"--servers={','.join(servers)}",
         "--num_workers=2", f"--worker_rank={rank}", "--steps=10",
         f"--job_name={job_name}"],
        env=dict(os.environ), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
        preexec_fn=server_process.die_with_parent) for rank in range(2)]
    logs = [worker.communicate(timeout=120)[0] for worker in workers]
    for rank, (worker, log) in enumerate(zip(workers, logs)):
        assert worker.returncode == 0, f"worker {rank}:\n{log}"
        assert f"[worker {rank}] step 10 loss" in log
        assert f"[worker {rank}] final loss" in log
        assert "depot_seconds" in log  # the step cost, from last_step


def test_cpp_example_trains_and_prints_its_progress(servers, job_name):
    binary = os.environ.get("DEPOT_TRAIN_MLP") or str(
        REPO_ROOT / "build" / "client" / "examples" / "depot-train-mlp")
    assert os.access(binary, os.X_OK), f"{binary} is not built"
    workers = [subprocess.Popen(
        [binary, f"--servers={','.join(servers)}", "--num_workers=2",
         f"--worker_rank={rank}", "--steps=8", f"--job_name={job_name}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=server_process.die_with_parent) for rank in range(2)]
    logs = [worker.communicate(timeout=120)[0] for worker in workers]
    for rank, (worker, log) in enumerate(zip(workers, logs)):
        assert worker.returncode == 0, f"worker {rank}:\n{log}"
        step_lines = [line for line in log.splitlines()
                      if line.startswith(f"[worker {rank}] step ")]
        assert len(step_lines) == 8, log
        # The progress line: what the step waited on Depot, and what moved.
        fields = step_lines[-1].split()
        values = dict(zip(fields[4::2], fields[5::2]))
        assert float(values["depot_seconds"]) > 0
        assert float(values["depot_seconds"]) <= float(
            values["step_seconds"])
        assert float(values["sent_mb"]) > 0
        assert float(values["received_mb"]) > 0
        assert f"[worker {rank}] final loss" in log
