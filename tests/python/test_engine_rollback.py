"""Engine mode rides out a server restart too (docs/checkpoints.md,
"Rolling back"; docs/gpu.md): DepotOptimizer on the transfer engine
(engine="host": the same engine code as on a GPU, over host memory) whose
step fails because a server was killed and restarted behind the other calls
Job.reconcile, and raises depot.RolledBackError with the step every server
went back to, the parameters holding that step's weights; a trainer that
reloads its data position there ends bit for bit like an uninterrupted run.
A step that fails while every server is still at the step before is sent
again from the engine's gradient buffer and the run goes on without an
error."""

import torch

import depot
from depot.torch import DepotOptimizer
from test_rollback import (EVERY, batches, checkpointing_servers, one_step,
                           restart, train_through_rollbacks,
                           wait_for_manifest)


def train_reference(client, name, initial, data, delayed):
    model = torch.nn.Linear(32, 8)
    model.load_state_dict(initial)
    opt = DepotOptimizer(model.parameters(), client=client, job_name=name,
                         engine="host", lr=1e-2, chunk_elems=64,
                         delayed_update=delayed)
    at_step = {}
    for step, batch in enumerate(data, start=1):
        one_step(model, opt, batch)
        at_step[step] = [p.detach().clone() for p in model.parameters()]
    opt.synchronize()
    final = [p.detach().clone() for p in model.parameters()]
    opt.job.delete()
    opt.close()
    return at_step, final


def test_engine_step_raises_rolled_back_error_and_ends_bitwise(
        tmp_path, job_name):
    data = batches(10)
    torch.manual_seed(0)
    initial = torch.nn.Linear(32, 8).state_dict()
    with checkpointing_servers(tmp_path) as (servers, dirs):
        addresses = [s.address for s in servers]
        with depot.Client(addresses, unavailable_retry=20) as c:
            at_step, final = train_reference(c, f"{job_name}-ref", initial,
                                             data, delayed=False)
            model = torch.nn.Linear(32, 8)
            model.load_state_dict(initial)
            opt = DepotOptimizer(model.parameters(), client=c,
                                 job_name=job_name, engine="host", lr=1e-2,
                                 chunk_elems=64)
            for step in range(1, 7):
                one_step(model, opt, data[step - 1])
            for d in dirs:
                wait_for_manifest(d, job_name, EVERY)
            # Server 0 restarts at step 4; server 1 is at step 6.
            restart(servers, dirs, addresses, 0)

            def check(error):
                for p, q in zip(model.parameters(), at_step[error.step]):
                    assert torch.equal(p.detach(), q)

            rolled = train_through_rollbacks(
                lambda batch: one_step(model, opt, batch), data, 6, check)
            assert rolled == [EVERY]
            opt.synchronize()
            for p, q in zip(model.parameters(), final):
                assert torch.equal(p.detach(), q)
            assert opt.job.reconcile() == (len(data), False)
            opt.close()


def test_engine_step_sent_again_when_no_server_went_back(tmp_path,
                                                         job_name):
    """Both servers restart at the step the job is at (a checkpoint of it
    is complete on both): the next step fails on the dead connections,
    reconcile finds every server at the step before, and the engine sends
    the step again: no error, and the run ends bitwise."""
    data = batches(8)
    torch.manual_seed(0)
    initial = torch.nn.Linear(32, 8).state_dict()
    with checkpointing_servers(tmp_path) as (servers, dirs):
        addresses = [s.address for s in servers]
        with depot.Client(addresses, unavailable_retry=20) as c:
            _, final = train_reference(c, f"{job_name}-ref", initial, data,
                                       delayed=False)
            model = torch.nn.Linear(32, 8)
            model.load_state_dict(initial)
            opt = DepotOptimizer(model.parameters(), client=c,
                                 job_name=job_name, engine="host", lr=1e-2,
                                 chunk_elems=64)
            for step in range(1, EVERY + 1):
                one_step(model, opt, data[step - 1])
            for d in dirs:
                wait_for_manifest(d, job_name, EVERY)
            for s in range(2):
                restart(servers, dirs, addresses, s)
            for step in range(EVERY + 1, len(data) + 1):
                one_step(model, opt, data[step - 1])  # no error
            opt.synchronize()
            for p, q in zip(model.parameters(), final):
                assert torch.equal(p.detach(), q)
            opt.close()


def test_delayed_update_rolls_back_and_trains_on(tmp_path, job_name):
    """With the delayed update a failed step always rolls back (the next
    step's gradient was computed from weights the servers no longer agree
    on): RolledBackError names a step with a checkpoint, the parameters hold
    the servers' weights of it, and training goes on from there."""
    data = batches(10)
    torch.manual_seed(0)
    initial = torch.nn.Linear(32, 8).state_dict()
    with checkpointing_servers(tmp_path) as (servers, dirs):
        addresses = [s.address for s in servers]
        with depot.Client(addresses, unavailable_retry=20) as c:
            model = torch.nn.Linear(32, 8)
            model.load_state_dict(initial)
            opt = DepotOptimizer(model.parameters(), client=c,
                                 job_name=job_name, engine="host", lr=1e-2,
                                 chunk_elems=64, delayed_update=True)
            for step in range(1, 7):
                one_step(model, opt, data[step - 1])
            for d in dirs:
                wait_for_manifest(d, job_name, EVERY)
            restart(servers, dirs, addresses, 0)

            def check(error):
                pulled = torch.empty(opt.job.total_elems)
                opt.job.pull(out=pulled)
                flat = torch.cat([p.detach().reshape(-1)
                                  for p in model.parameters()])
                assert torch.equal(flat, pulled[:flat.numel()])

            rolled = train_through_rollbacks(
                lambda batch: one_step(model, opt, batch), data, 6, check)
            assert rolled == [EVERY]
            opt.synchronize()
            assert opt.job.reconcile() == (len(data), False)
            opt.close()
