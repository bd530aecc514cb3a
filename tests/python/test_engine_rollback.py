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

import contextlib
import time
import types

import pytest
import torch

import depot
from depot.torch import DepotOptimizer
from test_depotctl import depotctl, depotctl_json
from test_rollback import (EVERY, batches, checkpointing_servers, one_step,
                           restart, train_through_rollbacks,
                           wait_for_manifest)
from test_torch_engine import on_two_ranks


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


def holds_weights_of(model, at_step):
    """on_rollback for train_through_rollbacks: the parameters hold the
    uninterrupted run's weights of the step rolled back to."""
    def check(error):
        for p, q in zip(model.parameters(), at_step[error.step]):
            assert torch.equal(p.detach(), q)
    return check


@contextlib.contextmanager
def beside_an_uninterrupted_run(tmp_path, job_name, steps):
    """Two checkpointing servers and a client on them, after the
    uninterrupted run of `steps` batches from a Linear(32, 8)
    (train_reference, job "<job_name>-ref"). Yields a namespace: servers,
    dirs, addresses, client, data, initial (the weights), at_step and final
    (the run's weights)."""
    data = batches(steps)
    torch.manual_seed(0)
    initial = torch.nn.Linear(32, 8).state_dict()
    with checkpointing_servers(tmp_path) as (servers, dirs):
        addresses = [s.address for s in servers]
        with depot.Client(addresses, unavailable_retry=20) as c:
            at_step, final = train_reference(c, f"{job_name}-ref", initial,
                                             data, delayed=False)
            yield types.SimpleNamespace(
                servers=servers, dirs=dirs, addresses=addresses, client=c,
                data=data, initial=initial, at_step=at_step, final=final)


def engine_model(run, name, **options):
    """A Linear(32, 8) from run.initial and its DepotOptimizer on a host
    engine (lr 1e-2, chunks of 64, `options`): (model, opt)."""
    model = torch.nn.Linear(32, 8)
    model.load_state_dict(run.initial)
    opt = DepotOptimizer(model.parameters(), client=run.client,
                         job_name=name, engine="host", lr=1e-2,
                         chunk_elems=64, **options)
    return model, opt


def assert_ends_as(model, final):
    for p, q in zip(model.parameters(), final):
        assert torch.equal(p.detach(), q)


def test_a_refused_capture_send_warns_and_training_goes_on(
        tmp_path, job_name):
    """offload_fraction 0.5 with the servers checkpointing every 4 steps.
    The engine sends the kept state into the captures behind the steps, so
    an operator's `depotctl checkpoint` between the servers' update of step
    4 and the trainer's step() replaces the capture the send was to fill:
    the send is refused, synchronize() warns naming the step, last_capture
    holds the refusal, and training goes on, ending bitwise like an
    uninterrupted run."""
    job_name = job_name.replace("[", "-").replace("]", "")
    with beside_an_uninterrupted_run(tmp_path, job_name, 6) as run:
        servers = "--servers=" + ",".join(run.addresses)
        model, opt = engine_model(run, job_name, offload_fraction=0.5)
        for step in range(1, EVERY):
            one_step(model, opt, run.data[step - 1])
        # Step 4 up to step(): backward begins it and sends the gradients.
        x, y = run.data[EVERY - 1]
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        deadline = time.monotonic() + 30
        while True:  # (depotctl: the trainer's Job is the engine's now)
            jobs = depotctl_json(servers, "jobs")["jobs"]
            if [(j["step_min"], j["step_max"]) for j in jobs
                    if j["name"] == job_name] == [(EVERY, EVERY)]:
                break
            assert time.monotonic() < deadline, jobs
            time.sleep(0.01)
        while True:  # a server may still write its shard's capture
            code, out, err = depotctl(servers, "checkpoint", job_name)
            if code == 0:
                break
            assert time.monotonic() < deadline, (code, out, err)
            time.sleep(0.01)
        opt.step()
        assert opt.last_result.capture_step == 0
        with pytest.warns(RuntimeWarning,
                          match=f"step {EVERY}: .*no checkpoint capture of "
                                f"step {EVERY} waits"):
            opt.synchronize()
        assert (opt.last_capture.step, opt.last_capture.chunks) == (EVERY, 0)
        for step in range(EVERY + 1, 7):
            one_step(model, opt, run.data[step - 1])
        opt.synchronize()
        assert_ends_as(model, run.final)
        opt.close()


def test_engine_step_raises_rolled_back_error_and_ends_bitwise(
        tmp_path, job_name):
    with beside_an_uninterrupted_run(tmp_path, job_name, 10) as run:
        model, opt = engine_model(run, job_name)
        for step in range(1, 7):
            one_step(model, opt, run.data[step - 1])
        for d in run.dirs:
            wait_for_manifest(d, job_name, EVERY)
        # Server 0 restarts at step 4; server 1 is at step 6.
        restart(run.servers, run.dirs, run.addresses, 0)

        rolled = train_through_rollbacks(
            lambda batch: one_step(model, opt, batch), run.data, 6,
            holds_weights_of(model, run.at_step))
        assert rolled == [EVERY]
        opt.synchronize()
        assert_ends_as(model, run.final)
        assert opt.job.reconcile() == (len(run.data), False)
        opt.close()


def test_engine_step_sent_again_when_no_server_went_back(tmp_path,
                                                         job_name):
    """Both servers restart at the step the job is at (a checkpoint of it
    is complete on both): the next step fails on the dead connections,
    reconcile finds every server at the step before, and the engine sends
    the step again: no error, and the run ends bitwise."""
    with beside_an_uninterrupted_run(tmp_path, job_name, 8) as run:
        model, opt = engine_model(run, job_name)
        for step in range(1, EVERY + 1):
            one_step(model, opt, run.data[step - 1])
        for d in run.dirs:
            wait_for_manifest(d, job_name, EVERY)
        for s in range(2):
            restart(run.servers, run.dirs, run.addresses, s)
        for step in range(EVERY + 1, len(run.data) + 1):
            one_step(model, opt, run.data[step - 1])  # no error
        opt.synchronize()
        assert_ends_as(model, run.final)
        opt.close()


@pytest.mark.parametrize("scenario", ["periodic", "reference", "none"])
def test_engine_with_an_offload_fraction_rolls_back_to_a_whole_checkpoint(
        tmp_path, job_name, scenario):
    """offload_fraction 0.5 (the bias' optimizer on the device), periodic
    checkpoints every 4 steps, which the engine fills with the kept state
    (docs/checkpoints.md, "The state the workers keep"). Both servers are
    killed and restart from their newest checkpoint:
    - periodic: after step 5 they restore step 4, whose checkpoint holds
      the kept state: the next step rolls back to it by itself,
      RolledBackError(4);
    - reference: a reference at step 2, then a checkpoint of step 3 taken
      by the bare job (Job.checkpoint(), which does not store the kept
      state: the servers mark it as lacking it); they restore 3, and the
      job goes back to 2, below it, with the kept state read back;
    - none: the same without the reference: no checkpoint holds the kept
      state, and the next step fails, naming the remedy.
    A trainer that reloads its data position where the job went ends
    bitwise like an uninterrupted run."""
    # A name the checkpoint directory keeps as it is (wait_for_manifest).
    job_name = job_name.replace("[", "-").replace("]", "")
    with beside_an_uninterrupted_run(tmp_path, job_name, 8) as run:
        model, opt = engine_model(run, job_name, offload_fraction=0.5)
        assert opt.engine.device_tensors == [1]
        last = 5 if scenario == "periodic" else 3
        for step in range(1, last + 1):
            one_step(model, opt, run.data[step - 1])
            if step == EVERY:
                # Sent behind the step: its own result does not report it.
                assert opt.last_result.capture_step == 0
                assert opt.engine.wait_captures() == \
                    depot.engine.CaptureReport(EVERY, 1, "")
            if scenario == "reference" and step == 2:
                opt.state_dict(reference=True)
        if scenario == "periodic":
            for d in run.dirs:
                wait_for_manifest(d, job_name, EVERY)
        else:
            assert opt.job.checkpoint() == 3
        for s in range(2):
            restart(run.servers, run.dirs, run.addresses, s)
        if scenario == "none":
            with pytest.raises(depot.DepotError,
                               match="recovers by itself only to a "
                                     "checkpoint"):
                one_step(model, opt, run.data[last])
            opt.close()
            return

        rolled = train_through_rollbacks(
            lambda batch: one_step(model, opt, batch), run.data, last,
            holds_weights_of(model, run.at_step))
        assert rolled == [EVERY if scenario == "periodic" else 2]
        opt.synchronize()
        assert_ends_as(model, run.final)
        opt.close()


class _SlowBackward(torch.autograd.Function):
    """The identity, whose backward waits: the buckets after it are named
    that much later."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        time.sleep(0.5)
        return grad


class _TwoLayers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first = torch.nn.Linear(32, 16)
        self.last = torch.nn.Linear(16, 8)

    def forward(self, x):
        return self.last(_SlowBackward.apply(self.first(x)))


def test_engine_step_that_fails_inside_backward_is_sent_again(tmp_path,
                                                                job_name):
    """As above, but the step's failure comes while backward still runs:
    the last layer's buckets begin the step on the restarted servers, whose
    streams fail at once, and the first layer's buckets are named half a
    second later. Their naming must not raise the step's error from inside
    backward (where nothing recovers: before 2026-11-29 it raised
    NotFoundError from loss.backward() now and then, the flake of
    test_engine_step_sent_again_when_no_server_went_back); step() finishes
    the step, which reports it, and sends it again: no error, bitwise."""
    data = batches(EVERY + 2)
    torch.manual_seed(0)
    initial = _TwoLayers().state_dict()

    def optimizer(model, client, name):
        return DepotOptimizer(model.parameters(), client=client,
                              job_name=name, engine="host", lr=1e-2,
                              chunk_elems=64, bucket_chunks=1)

    def step(model, opt, batch):
        x, y = batch
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        opt.step()

    with checkpointing_servers(tmp_path) as (servers, dirs):
        addresses = [s.address for s in servers]
        with depot.Client(addresses, unavailable_retry=20) as c:
            reference = _TwoLayers()
            reference.load_state_dict(initial)
            ref_opt = optimizer(reference, c, f"{job_name}-ref")
            for batch in data:
                step(reference, ref_opt, batch)
            ref_opt.synchronize()
            ref_opt.close()
            model = _TwoLayers()
            model.load_state_dict(initial)
            opt = optimizer(model, c, job_name)
            assert len(opt.engine.bucket_ranges) > 2
            for batch in data[:EVERY]:
                step(model, opt, batch)
            for d in dirs:
                wait_for_manifest(d, job_name, EVERY)
            for s in range(2):
                restart(servers, dirs, addresses, s)
            for batch in data[EVERY:]:
                step(model, opt, batch)  # no error
            opt.synchronize()
            for p, q in zip(model.parameters(), reference.parameters()):
                assert torch.equal(p.detach(), q.detach())
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


def node_of_two_ranks(client, name, initial, delayed):
    """One node of two local ranks (host engines on two threads, one node
    id): (models, opts), each rank's model starting from `initial`."""
    node = depot.engine.unique_id("host")
    in_features = initial["weight"].shape[1]
    models = [torch.nn.Linear(in_features, 8) for _ in range(2)]
    opts = [None, None]

    def construct(rank):
        models[rank].load_state_dict(initial)
        opts[rank] = DepotOptimizer(
            models[rank].parameters(), client=client, job_name=name,
            engine="host", lr=1e-2, chunk_elems=64, bucket_chunks=2,
            local_rank=rank, local_ranks=2, node_id=node,
            delayed_update=delayed)

    on_two_ranks(construct)
    return models, opts


def rank_step(model, opt, batch, rank):
    x, y = batch
    one_step(model, opt, (x[rank::2], y[rank::2]))


# (in_features, restarted server, delayed update): with 15 inputs the job is
# two chunks, one per server and per local rank, so the restart fails the
# step on one rank while the other's goes through (before, that rank then
# waited for ever in the all-gather the failed rank never queued); with 32,
# five chunks, every rank has chunks on both servers.
@pytest.mark.parametrize("in_features,restarted,delayed",
                         [(15, 1, False), (15, 0, True), (32, 0, False)])
def test_node_of_two_ranks_rolls_back_on_every_rank_and_ends_bitwise(
        tmp_path, in_features, restarted, delayed):
    """A node of two local ranks whose server restarts behind a checkpoint:
    every rank gets RolledBackError with the checkpoint's step, the one
    whose own part of the step went through as well (from the node's
    verdict on the step, before it begins the next), none hangs, and the
    run ends bit for bit as the same node's uninterrupted run (with the
    delayed update: the servers' weights and a consistent job)."""
    # The servers are this test's own; the name needs no escaping in their
    # checkpoint directory.
    job_name = f"node-{in_features}-{restarted}-{int(delayed)}"
    torch.manual_seed(0)
    data = [(torch.randn(6, in_features), torch.randn(6, 8))
            for _ in range(10)]
    initial = torch.nn.Linear(in_features, 8).state_dict()
    with checkpointing_servers(tmp_path) as (servers, dirs):
        addresses = [s.address for s in servers]
        with depot.Client(addresses, unavailable_retry=20) as c:
            final = None
            if not delayed:
                models, opts = node_of_two_ranks(c, f"{job_name}-ref",
                                                 initial, delayed)

                def reference(rank):
                    for batch in data:
                        rank_step(models[rank], opts[rank], batch, rank)
                    opts[rank].synchronize()

                on_two_ranks(reference)
                final = [p.detach().clone() for p in models[0].parameters()]
                opts[0].job.delete()
                for o in opts:
                    o.close()

            models, opts = node_of_two_ranks(c, job_name, initial, delayed)
            on_two_ranks(lambda rank: [rank_step(models[rank], opts[rank],
                                             data[s], rank)
                                   for s in range(6)])
            for d in dirs:
                wait_for_manifest(d, job_name, EVERY)
            restart(servers, dirs, addresses, restarted)
            rolled = [None, None]

            def train_on(rank):
                rolled[rank] = train_through_rollbacks(
                    lambda batch: rank_step(models[rank], opts[rank], batch,
                                            rank),
                    data, 6, lambda error: None)
                opts[rank].synchronize()

            on_two_ranks(train_on)
            assert rolled == [[EVERY], [EVERY]]
            for rank in range(2):
                got = [p.detach() for p in models[rank].parameters()]
                if final is not None:
                    for p, q in zip(got, final):
                        assert torch.equal(p, q)
                else:
                    pulled = torch.empty(opts[rank].job.total_elems)
                    opts[rank].job.pull(out=pulled)
                    for p, offset, numel in opts[rank]._slots:
                        assert torch.equal(p.detach().reshape(-1),
                                           pulled[offset:offset + numel])
            assert opts[0].job.reconcile() == (len(data), False)
            for o in opts:
                o.close()


@pytest.mark.parametrize("how", ["goes_back", "resumes"])
def test_node_with_an_offload_fraction_returns_to_a_periodic_checkpoint(
        tmp_path, job_name, how):
    """A node of two local ranks with offload_fraction 0.5 on servers that
    checkpoint every 4 steps: each rank fills the checkpoint of step 4 with
    its part of the kept state. Both servers are killed after step 5 and
    restart from step 4. goes_back: the next step fails on both ranks, the
    ranks agree on step 4 (Engine.agree_on_step), rank 0 rolls the job back
    to it and every rank reads its part of the kept state back:
    RolledBackError(4) on both. resumes: the trainers exit, and a new node
    with resume=True reads the kept state back on every rank. Either way
    the node ends bit for bit as an uninterrupted node's run."""
    from test_torch_engine import (assert_bitwise, loss_of, model_and_data,
                                   node_of_two_ranks)
    job_name = job_name.replace("[", "-").replace("]", "")
    model, inputs, targets = model_and_data()
    steps = len(inputs)
    assert steps > EVERY + 1
    rolled = [[], []]

    def train(models, opts, first, last=steps):
        def rank_loop(rank):
            s = first
            while s < last:
                opts[rank].zero_grad()
                try:
                    loss_of(models[rank], inputs[s][rank::2],
                            targets[s][rank::2]).backward()
                    opts[rank].step()
                    s += 1
                except depot.RolledBackError as error:
                    rolled[rank].append(error.step)
                    s = error.step  # the data position to reload
        on_two_ranks(rank_loop)

    with checkpointing_servers(tmp_path) as (servers, dirs):
        addresses = [s.address for s in servers]
        with depot.Client(addresses, unavailable_retry=20) as c:
            models, opts = node_of_two_ranks(model, c, f"{job_name}-ref",
                                             offload_fraction=0.5)
            train(models, opts, 0)
            want = [p.detach().clone() for p in models[0].parameters()]
            for o in opts:
                o.close()
            assert rolled == [[], []]

            models, opts = node_of_two_ranks(model, c, job_name,
                                             offload_fraction=0.5)
            assert all(o.engine.device_tensors for o in opts)
            train(models, opts, 0, EVERY + 1)
            for d in dirs:
                wait_for_manifest(d, job_name, EVERY)
            for s in range(2):
                restart(servers, dirs, addresses, s)
            if how == "resumes":
                for o in opts:
                    o.close()
                models, opts = node_of_two_ranks(model, c, job_name,
                                                 offload_fraction=0.5,
                                                 resume=True)
                assert [o.resumed_step for o in opts] == [EVERY, EVERY]
            train(models, opts, EVERY + 1 if how == "goes_back" else EVERY)
            assert rolled == ([[EVERY], [EVERY]] if how == "goes_back"
                              else [[], []])
            for rank in range(2):
                assert_bitwise(
                    [p.detach() for p in models[rank].parameters()], want)
            for o in opts:
                o.close()
