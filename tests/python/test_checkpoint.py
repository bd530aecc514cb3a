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


@pytest.mark.parametrize("engine", [None, "host"])
def test_optimizer_resumes_from_a_restarted_servers_checkpoint(
        tmp_path, job_name, engine):
    """DepotOptimizer.checkpoint() at step 3, one more step, the server
    stopped and started again on its --checkpoint_dir: a new optimizer with
    resume=True continues from step 3 (the parameters take the servers'
    weights) and ends bit for bit like an uninterrupted run."""
    flags = [f"--checkpoint_dir={tmp_path}", "--threads=1"]
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    initial = copy.deepcopy(model.state_dict())
    data = [(torch.randn(5, 8), torch.randn(5, 4)) for _ in range(6)]
    options = dict(lr=1e-2, weight_decay=0.1, engine=engine)

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
            run(model, opt, data[:3])
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
