"""Rolling back from Python (docs/checkpoints.md, "Rolling back"): a server
killed with SIGKILL and restarted on its --checkpoint_dir comes back behind
the other; DepotOptimizer.step() raises depot.RolledBackError with the step
every server went back to, the parameters already hold that step's weights,
and a trainer that reloads its data position there ends bit for bit like an
uninterrupted run."""

import contextlib
import glob
import os
import time

import pytest
import torch

import depot
import server_process
from conftest import server_binary
from depot.torch import DepotOptimizer

# Both servers hold chunks (64 elements each), so both write checkpoints.
EVERY = 4


def batches(count):
    torch.manual_seed(1)
    return [(torch.randn(5, 32), torch.randn(5, 8)) for _ in range(count)]


def one_step(model, opt, batch):
    x, y = batch
    opt.zero_grad()
    ((model(x) - y) ** 2).mean().backward()
    opt.step()


def wait_for_manifest(directory, job, step):
    """Checkpoints are written in the background: wait for the manifest of
    job's step (job names here need no escaping in the directory's name)."""
    pattern = os.path.join(directory, f"job-{job}", f"step-{step:020d}",
                           "manifest-*")
    deadline = time.monotonic() + 30
    # Not a manifest still being written (its temporary file's name begins
    # the same way: "manifest-0-of-2.tmp-PID-N").
    while not [m for m in glob.glob(pattern) if ".tmp-" not in m]:
        assert time.monotonic() < deadline, \
            f"no checkpoint of step {step} in {directory}"
        time.sleep(0.01)


def start(directory, address=None):
    flags = [f"--checkpoint_dir={directory}",
             f"--checkpoint_every_steps={EVERY}", "--threads=1"]
    if address is not None:
        flags.append(f"--listen={address}")  # the same port as before
    return server_process.start_server(server_binary(), flags)


@contextlib.contextmanager
def checkpointing_servers(tmp_path, count=2):
    """`count` servers (start) on their own directories under `tmp_path`;
    yields (servers, dirs) and stops whatever `servers` holds at the end
    (restart replaces its entries)."""
    dirs = [str(tmp_path / f"server-{s}") for s in range(count)]
    servers = []
    try:
        for d in dirs:
            servers.append(start(d))
        yield servers, dirs
    finally:
        for server in servers:
            server.stop()


def restart(servers, dirs, addresses, index):
    """Kills server `index` with SIGKILL and starts it again on its
    checkpoint directory and port: it restores its jobs from their newest
    complete checkpoints."""
    servers[index].process.kill()
    servers[index].process.wait()
    servers[index] = start(dirs[index], address=addresses[index])


def train_through_rollbacks(train_step, data, step, on_rollback):
    """Trains data[step:] with train_step(batch); on a RolledBackError calls
    on_rollback(error) and goes on from the step it names, as a trainer
    reloading its data position. Returns the steps rolled back to."""
    rolled = []
    while step < len(data):
        try:
            train_step(data[step])
            step += 1
        except depot.RolledBackError as error:
            rolled.append(error.step)
            on_rollback(error)
            step = error.step  # the data position to reload
    return rolled


def test_step_raises_rolled_back_error_and_the_run_ends_bitwise(
        tmp_path, job_name):
    data = batches(10)
    torch.manual_seed(0)
    initial = torch.nn.Linear(32, 8).state_dict()
    with checkpointing_servers(tmp_path) as (servers, dirs):
        addresses = [s.address for s in servers]
        with depot.Client(addresses, unavailable_retry=20) as c:
            reference = torch.nn.Linear(32, 8)
            reference.load_state_dict(initial)
            ref_opt = DepotOptimizer(reference.parameters(), client=c,
                                     job_name=f"{job_name}-ref", lr=1e-2,
                                     chunk_elems=64)
            at_step = {}
            for step, batch in enumerate(data, start=1):
                one_step(reference, ref_opt, batch)
                at_step[step] = [p.detach().clone()
                                 for p in reference.parameters()]
            ref_opt.close()

            model = torch.nn.Linear(32, 8)
            model.load_state_dict(initial)
            opt = DepotOptimizer(model.parameters(), client=c,
                                 job_name=job_name, lr=1e-2, chunk_elems=64)
            for step in range(1, 7):
                one_step(model, opt, data[step - 1])
            for d in dirs:
                wait_for_manifest(d, job_name, EVERY)
            # Server 0 restarts at step 4; server 1 is at step 6.
            restart(servers, dirs, addresses, 0)

            def check(error):
                assert isinstance(error, depot.AbortedError)
                # The parameters already hold the weights of error.step.
                for p, q in zip(model.parameters(), at_step[error.step]):
                    assert torch.equal(p.detach(), q)

            rolled = train_through_rollbacks(
                lambda batch: one_step(model, opt, batch), data, 6, check)
            assert rolled == [EVERY]
            for p, q in zip(model.parameters(), reference.parameters()):
                assert torch.equal(p.detach(), q.detach())
            opt.close()


def test_job_reconcile_and_roll_back(tmp_path, job_name):
    """Job.reconcile() on servers that agree changes nothing; roll_back()
    to a step without a checkpoint is NotFoundError and changes nothing."""
    with checkpointing_servers(tmp_path) as (servers, _):
        with depot.Client([s.address for s in servers]) as c:
            job = c.open_job(job_name, [("w", 256, 0)], lr=1e-3,
                             chunk_elems=64)
            job.init_weights(torch.zeros(256))
            grads = torch.ones(256)
            weights = torch.empty(256)
            for step in range(1, 6):
                job.step(step, grads, weights)
            for s in range(2):
                wait_for_manifest(str(tmp_path / f"server-{s}"), job_name,
                                  EVERY)
            assert job.reconcile() == (5, False)
            with pytest.raises(depot.NotFoundError, match="checkpoint of step 2"):
                job.roll_back(2)
            assert job.reconcile() == (5, False)
            job.roll_back(EVERY)
            assert job.reconcile() == (EVERY, False)
            with pytest.raises(depot.RolledBackError) as raised:
                job.step(7, grads, weights)  # the job is at step 4 now
            assert raised.value.step == EVERY
            job.step(EVERY + 1, grads, weights)
            job.delete()
            job.close()


def test_rollback_restores_the_dynamic_loss_scale(tmp_path, job_name):
    """A dynamic loss scaler lives in the trainer, not on the servers: a
    rollback to step t must also take it back to its state after t. Steps 5
    and 6 overflow fp16 (their batches are scaled up), so the scaler backs
    off after the checkpoint of step 4; after the rollback the steps run
    again from the scaler of step 4, and the run ends bitwise like an
    uninterrupted one (with the scaler left as it was, it does not)."""
    data = batches(10)
    for i in (4, 5):  # the batches of steps 5 and 6
        x, y = data[i]
        data[i] = (x * 1e4, y * 1e4)
    torch.manual_seed(0)
    initial = torch.nn.Linear(32, 8).state_dict()
    dirs = [str(tmp_path / f"server-{s}") for s in range(2)]
    servers = [start(d) for d in dirs]
    options = dict(lr=1e-2, chunk_elems=64, grad_dtype="fp16",
                   loss_scale="megatron", initial_loss_scale=2.0**16)

    def scaled_step(model, opt, batch):
        x, y = batch
        opt.zero_grad()
        opt.scale_loss(((model(x) - y) ** 2).mean()).backward()
        opt.step()

    try:
        addresses = [s.address for s in servers]
        with depot.Client(addresses, unavailable_retry=20) as c:
            reference = torch.nn.Linear(32, 8)
            reference.load_state_dict(initial)
            ref_opt = DepotOptimizer(reference.parameters(), client=c,
                                     job_name=f"{job_name}-ref", **options)
            scales = {}
            for step, batch in enumerate(data, start=1):
                scaled_step(reference, ref_opt, batch)
                scales[step] = ref_opt.loss_scale
            assert scales[6] < scales[4]  # the overflows backed off
            ref_opt.close()

            model = torch.nn.Linear(32, 8)
            model.load_state_dict(initial)
            opt = DepotOptimizer(model.parameters(), client=c,
                                 job_name=job_name, **options)
            for step in range(1, 7):
                scaled_step(model, opt, data[step - 1])
            for d in dirs:
                wait_for_manifest(d, job_name, EVERY)
            restart(servers, dirs, addresses, 0)

            def check(error):
                assert opt.loss_scale == scales[error.step]

            rolled = train_through_rollbacks(
                lambda batch: scaled_step(model, opt, batch), data, 6, check)
            assert rolled == [EVERY]
            assert opt.loss_scale == scales[len(data)]
            for p, q in zip(model.parameters(), reference.parameters()):
                assert torch.equal(p.detach(), q.detach())
            opt.close()
    finally:
        for server in servers:
            server.stop()


def test_save_state_refuses_servers_at_different_steps(tmp_path, job_name):
    """A server restarted behind the others holds the job at an older step:
    save_state() must not mix the two into a state no run ever had. It
    raises AbortedError naming both steps; after reconcile() it saves."""
    with checkpointing_servers(tmp_path) as (servers, dirs):
        addresses = [s.address for s in servers]
        with depot.Client(addresses, unavailable_retry=20) as c:
            job = c.open_job(job_name, [("w", 256, 0)], lr=1e-2,
                             chunk_elems=64)
            n = job.total_elems
            job.init_weights(torch.zeros(n))
            weights = torch.empty(n)
            for t in range(1, 7):
                job.step(t, torch.full((n,), float(t)), weights)
            for d in dirs:
                wait_for_manifest(d, job_name, EVERY)
            restart(servers, dirs, addresses, 0)
            with pytest.raises(depot.AbortedError,
                               match=f"different steps.*step {EVERY}.*"
                                     f"step 6"):
                job.save_state()
            assert job.reconcile() == (EVERY, True)
            assert len(job.save_state()) > 0
