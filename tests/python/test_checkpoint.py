"""Server-side checkpoints from Python (docs/checkpoints.md): Job.checkpoint()
and DepotOptimizer.checkpoint() against a real depot-server with a
--checkpoint_dir, which restores the job by itself after it is killed."""

import copy

import pytest
import torch

import depot
import server_process
from conftest import server_binary
from depot.torch import DepotOptimizer
from test_rollback import wait_for_manifest


def test_checkpoint_needs_a_checkpoint_dir(client, job_name):
    job = client.open_job(job_name, [("w", 64, 0)], lr=1e-3)
    try:
        job.init_weights(torch.zeros(64))
        try:
            job.checkpoint()
            raise AssertionError("checkpoint() without --checkpoint_dir")
        except depot.FailedPreconditionError as error:
            assert "--checkpoint_dir" in str(error)
    finally:
        job.delete()
        job.close()


def run(model, opt, batches):
    for x, y in batches:
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        opt.step()


@pytest.mark.parametrize("engine,offload,periodic", [
    (None, 1.0, False), ("host", 1.0, False), ("host", 0.5, False),
    ("host", 0.5, True)])
def test_optimizer_resumes_from_a_restarted_servers_checkpoint(
        tmp_path, job_name, engine, offload, periodic):
    """DepotOptimizer.checkpoint() at step 3 (or, `periodic`, the server's
    own checkpoint of step 3), one more step, the server stopped and started
    again on its --checkpoint_dir: a new optimizer with resume=True
    continues from step 3 (the parameters take the servers' weights) and
    ends bit for bit like an uninterrupted run. With an offload fraction the
    state of the parameters kept on the device comes back from the
    checkpoint too, which holds it (docs/checkpoints.md, "The state the
    workers keep")."""
    # A name the checkpoint directory keeps as it is (wait_for_manifest).
    job_name = job_name.replace("[", "-").replace("]", "")
    flags = [f"--checkpoint_dir={tmp_path}", "--threads=1"]
    if periodic:
        flags.append("--checkpoint_every_steps=3")
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    initial = copy.deepcopy(model.state_dict())
    data = [(torch.randn(5, 8), torch.randn(5, 4)) for _ in range(6)]
    options = dict(lr=1e-2, weight_decay=0.1, engine=engine)
    if offload < 1.0:
        options.update(offload_fraction=offload, chunk_elems=64)

    server = server_process.start_server(server_binary(), flags)
    try:
        with depot.Client([server.address]) as c:
            reference = torch.nn.Linear(8, 4)
            reference.load_state_dict(initial)
            ref_opt = DepotOptimizer(reference.parameters(), client=c,
                                     job_name=f"{job_name}-ref", **options)
            run(reference, ref_opt, data)
            opt = DepotOptimizer(model.parameters(), client=c,
                                 job_name=job_name, **options)
            if offload < 1.0:
                assert opt.engine.device_tensors == [1]  # the bias
            run(model, opt, data[:3])
            if periodic:
                # Sent behind the step: its own result does not report it;
                # synchronize() waits for the send.
                assert opt.last_result.capture_step == 0
                opt.synchronize()
                assert opt.last_capture == depot.engine.CaptureReport(3, 1, "")
                wait_for_manifest(str(tmp_path), job_name, 3)
            else:
                assert opt.checkpoint() == 3
            run(model, opt, data[3:4])  # lost: not checkpointed
            opt.close()
            with pytest.raises(depot.FailedPreconditionError,
                               match="resume=True"):
                other = torch.nn.Linear(8, 4)
                run(other, DepotOptimizer(other.parameters(), client=c,
                                          job_name=job_name, **options),
                    data[:1])
    finally:
        server.stop()
    server = server_process.start_server(server_binary(), flags)
    try:
        with depot.Client([server.address]) as c:
            fresh = torch.nn.Linear(8, 4)  # other initial values
            opt = DepotOptimizer(fresh.parameters(), client=c,
                                 job_name=job_name, resume=True, **options)
            assert opt.resumed_step == 3
            run(fresh, opt, data[3:])
            opt.close()
    finally:
        server.stop()
    for p, q in zip(fresh.parameters(), reference.parameters()):
        assert torch.equal(p.detach(), q.detach())


def test_import_checkpoint_onto_another_server_count(tmp_path, job_name):
    """Job.import_checkpoint: a checkpoint that 3 servers wrote loads into
    the same job opened on 2 other servers; their weights are the old job's
    at that step, the next step equals the old job's next step bit for bit,
    and a directory missing from the list fails with nothing imported."""
    tensors = [("w", 300, 0), ("b", 20, 0)]
    dirs = [str(tmp_path / f"old-{s}") for s in range(3)]
    old = [server_process.start_server(server_binary(),
                                       [f"--checkpoint_dir={d}"])
           for d in dirs]
    new = [server_process.start_server(server_binary(),
                                       [f"--import_roots={tmp_path}"])
           for _ in range(2)]
    try:
        with depot.Client([s.address for s in old]) as c3, \
                depot.Client([s.address for s in new]) as c2:
            job3 = c3.open_job(job_name, tensors, lr=1e-2, chunk_elems=64)
            n = job3.total_elems  # with the layout's padding
            torch.manual_seed(0)
            initial = torch.randn(n)
            grads = [torch.randn(n) for _ in range(4)]
            job3.init_weights(initial)
            weights3 = torch.empty(n)
            for t in (1, 2, 3):
                job3.step(t, grads[t - 1], weights3)
            assert job3.checkpoint() == 3
            expected_next = torch.empty(n)
            job3.step(4, grads[3], expected_next)

            job2 = c2.open_job(job_name, tensors, lr=1e-2, chunk_elems=64)
            job2.init_weights(torch.zeros(n))
            with pytest.raises(depot.FailedPreconditionError,
                               match="manifest-2-of-3"):
                job2.import_checkpoint(3, dirs[:2])  # server 2's part missing
            assert torch.equal(torch.from_numpy(job2.pull()),
                               torch.zeros(n))  # untouched
            job2.import_checkpoint(3, dirs)
            assert torch.equal(torch.from_numpy(job2.pull()), weights3)
            weights2 = torch.empty(n)
            job2.step(4, grads[3], weights2)
            assert torch.equal(weights2, expected_next)
            with pytest.raises(ValueError):
                job2.import_checkpoint(3, [])
    finally:
        for server in old + new:
            server.stop()
