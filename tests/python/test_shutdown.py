"""A trainer's state_dict() while its server shuts down (issue 12 part 7):
the call raises depot.UnavailableError, a ConnectionError the trainer can
catch and retry once the server is back, instead of crashing the trainer;
the checkpoint the server was writing when SIGTERM came is completed, and the
restarted server resumes from it."""

import signal
import time

import pytest
import torch

import depot
import server_process
from conftest import server_binary
from depot.torch import DepotOptimizer

GRACE_SECONDS = 60


def wait_for(predicate, what, timeout=60.0):
    """Polls `predicate` (a log line, a file) until it holds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.005)


def run(model, opt, batches):
    for x, y in batches:
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        opt.step()


def test_state_dict_during_sigterm_raises_a_catchable_unavailable_error(
        tmp_path, job_name):
    # A periodic checkpoint at step 2, written slowly (a shard file of about
    # 1 KB at 256 B/s): the server is still writing it when SIGTERM comes,
    # and its drain waits for the write.
    flags = [f"--checkpoint_dir={tmp_path}", "--checkpoint_every_steps=2",
             "--checkpoint_write_bytes_per_second=256",
             f"--shutdown_grace_seconds={GRACE_SECONDS}", "--threads=1"]
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    data = [(torch.randn(5, 8), torch.randn(5, 4)) for _ in range(3)]
    server = server_process.start_server(server_binary(), flags)
    try:
        with depot.Client([server.address], unavailable_retry=0) as c:
            opt = DepotOptimizer(model.parameters(), client=c,
                                 job_name=job_name, lr=1e-2)
            run(model, opt, data[:2])
            wait_for(lambda: any(".tmp-" in p.name
                                 for p in tmp_path.rglob("*")),
                     "the checkpoint of step 2 is being written")
            server.process.send_signal(signal.SIGTERM)
            wait_for(lambda: "draining" in server.log(),
                     "the server began its drain")

            with pytest.raises(depot.UnavailableError) as raised:
                opt.state_dict()
            assert isinstance(raised.value, ConnectionError)
            assert "shutting down" in str(raised.value)
            opt.close()
        assert server.process.wait(GRACE_SECONDS + 10) == 0, server.log()
        assert "at step 2 written" in server.log()
    finally:
        server.stop()

    # The trainer, having caught the error, resumes once the server is back.
    server = server_process.start_server(server_binary(), flags)
    try:
        with depot.Client([server.address]) as c:
            opt = DepotOptimizer(model.parameters(), client=c,
                                 job_name=job_name, resume=True, lr=1e-2)
            assert opt.resumed_step == 2
            run(model, opt, data[2:])
            assert opt.state_dict()["depot_state"].numel() > 0
            opt.close()
    finally:
        server.stop()


def test_state_dict_after_the_server_stopped_raises_unavailable_error(
        job_name):
    server = server_process.start_server(server_binary(), ["--threads=1"])
    try:
        with depot.Client([server.address], unavailable_retry=0,
                          rpc_timeout=5, step_timeout=5) as c:
            model = torch.nn.Linear(8, 4)
            opt = DepotOptimizer(model.parameters(), client=c,
                                 job_name=job_name, lr=1e-2)
            run(model, opt, [(torch.randn(5, 8), torch.randn(5, 4))])
            assert server.stop() == 0
            with pytest.raises(depot.UnavailableError):
                opt.state_dict()
            opt.close()
    finally:
        server.stop()
