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
