"""The trainer's view of a step (issue 14: trainer-side visibility):
DepotOptimizer.last_step's exposed_seconds, wire_seconds,
server_update_seconds and payload bytes, and the opt-in Prometheus metrics of
the trainer process (serve_metrics), checked by Debian's promtool."""

import shutil
import subprocess
import urllib.request

import pytest
import torch

from depot.torch import DepotOptimizer


def train(opt, model, steps):
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(4, 32)).square().mean().backward()
        opt.step()


def scrape(address):
    with urllib.request.urlopen(f"http://{address}/metrics",
                                timeout=10) as reply:
        assert reply.headers["Content-Type"].startswith("text/plain")
        return reply.read().decode()


def value(text, name):
    for line in text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} missing from:\n{text}")


@pytest.mark.parametrize("engine", [None, "host"])
def test_last_step_has_the_step_cost(client, job_name, engine):
    torch.manual_seed(0)
    model = torch.nn.Linear(32, 8)
    opt = DepotOptimizer(model.parameters(), client=client,
                         job_name=job_name, lr=1e-2, engine=engine)
    train(opt, model, 2)
    last = opt.last_step
    assert last.exposed_seconds > 0
    assert last.wire_seconds > 0
    assert last.server_update_seconds > 0
    if engine is None:
        # The call to the servers happens inside step().
        assert last.wire_seconds <= last.exposed_seconds
    grad_bytes = sum(p.numel() for p in model.parameters()) * 4
    assert last.bytes_sent >= grad_bytes
    assert last.bytes_received >= grad_bytes
    opt.job.delete()
    opt.close()


def test_serve_metrics_sums_the_steps(client, job_name):
    torch.manual_seed(0)
    model = torch.nn.Linear(32, 8)
    opt = DepotOptimizer(model.parameters(), client=client,
                         job_name=job_name, lr=1e-2)
    address = opt.serve_metrics("127.0.0.1:0")
    with pytest.raises(RuntimeError, match="already serving"):
        opt.serve_metrics()
    exposed = 0.0
    sent = 0
    for _ in range(3):
        train(opt, model, 1)
        exposed += opt.last_step.exposed_seconds
        sent += opt.last_step.bytes_sent
    text = scrape(address)
    assert value(text, "depot_trainer_steps_total") == 3
    assert value(text, "depot_trainer_step") == 3
    assert value(text, "depot_trainer_exposed_seconds_total") == \
        pytest.approx(exposed)
    assert value(text, "depot_trainer_sent_bytes_total") == sent
    assert value(text, "depot_trainer_skipped_steps_total") == 0
    assert f'job_name="{job_name}"' in text
    promtool = shutil.which("promtool")
    assert promtool, "promtool is not installed (scripts/setup.sh)"
    check = subprocess.run([promtool, "check", "metrics"], input=text,
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    opt.job.delete()
    opt.close()
    with pytest.raises(OSError):
        scrape(address)  # closed with the optimizer


def test_serve_metrics_refuses_a_bad_address(client, job_name):
    model = torch.nn.Linear(4, 2)
    opt = DepotOptimizer(model.parameters(), client=client,
                         job_name=job_name, lr=1e-2)
    with pytest.raises(ValueError, match="host:port"):
        opt.serve_metrics("localhost")
    opt.close()
