"""state_dict by reference (docs/checkpoints.md, "state_dict by reference"):
DepotOptimizer.state_dict(reference=True) has the servers write a checkpoint
and holds only a reference to it, and load_state_dict takes the job back to
that step, against real depot-server processes with a --checkpoint_dir."""

import io
import os
import subprocess
import sys

import pytest
import torch

import depot
import server_process
import state_reference_worker as worker
from conftest import PACKAGE_DIR, TESTS_DIR, server_binary
from depot.torch import DepotOptimizer

SAVE_AT = 3
LAST = 6


def start(directory, *flags):
    return server_process.start_server(
        server_binary(), [f"--checkpoint_dir={directory}", "--threads=1",
                          *flags])


@pytest.fixture
def two_servers(tmp_path):
    """Two servers with checkpoint directories; yields (servers, dirs)."""
    dirs = [str(tmp_path / f"server-{s}") for s in range(2)]
    servers = [start(d) for d in dirs]
    try:
        yield servers, dirs
    finally:
        for server in servers:
            server.stop()


def uninterrupted(client, job_name):
    """The parameters after every step of an uninterrupted run."""
    model = worker.make_model(seed=0)
    opt = DepotOptimizer(model.parameters(), client=client,
                         job_name=f"{job_name}-whole", **worker.OPTIONS)
    at_step = {}
    for step in range(1, LAST + 1):
        worker.train(model, opt, step, step)
        at_step[step] = [p.detach().clone() for p in model.parameters()]
    opt.close()
    return at_step


def saved_size(state):
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.tell()


def checksums(job):
    return [s.state_checksum for s in job.status(with_checksum=True)]


@pytest.mark.parametrize("engine,kept", [(None, {}), ("host", {}),
                                         ("host", {"offload_fraction": 0.5})])
def test_reference_is_small_and_a_fresh_optimizer_goes_back_to_it_bitwise(
        two_servers, job_name, engine, kept):
    """A reference at step 3, two more steps, then a new optimizer on the
    job loads it: the servers are back at step 3, the parameters hold its
    weights, and three more steps end bitwise like an uninterrupted run.
    (With an engine the job opens at construction: resume=True.) With an
    offload fraction the kept parameter (the bias) has its optimizer state
    on the device: the reference stores it into the servers' arrays before
    their checkpoint, and the load reads it back; without that the new
    optimizer would refuse to step, or step from the initial state."""
    servers, _ = two_servers
    with depot.Client([s.address for s in servers]) as c:
        want = uninterrupted(c, job_name)
        model = worker.make_model(seed=0)
        opt = DepotOptimizer(model.parameters(), client=c, job_name=job_name,
                             state_dict_reference=True, engine=engine,
                             **kept, **worker.OPTIONS)
        if kept:
            assert opt.engine.device_tensors == [1]  # the bias
        worker.train(model, opt, 1, SAVE_AT)
        state = opt.state_dict()  # by reference: the constructor's choice
        reference = state["depot_reference"]
        assert "depot_state" not in state
        assert reference["job"] == job_name
        assert reference["step"] == state["depot_step"] == SAVE_AT
        assert reference["fingerprint"] == opt.job.fingerprint
        assert reference["servers"] == [s.address for s in servers]
        assert sum(p.numel() for p in model.parameters()) > 1_000_000
        assert saved_size(state) < 4096
        # By value, the same optimizer's dict holds 12 bytes per parameter.
        assert saved_size(opt.state_dict(reference=False)) > 12_000_000
        worker.train(model, opt, SAVE_AT + 1, SAVE_AT + 2)  # to be undone

        fresh = worker.make_model(seed=7)
        fresh_opt = DepotOptimizer(fresh.parameters(), client=c,
                                   job_name=job_name, engine=engine,
                                   resume=engine is not None, **kept,
                                   **worker.OPTIONS)
        fresh_opt.load_state_dict(torch.load(io.BytesIO(_saved(state)))["opt"])
        assert [s.step for s in fresh_opt.job.status()] == [SAVE_AT] * 2
        for p, q in zip(fresh.parameters(), want[SAVE_AT]):
            assert torch.equal(p.detach(), q)
        worker.train(fresh, fresh_opt, SAVE_AT + 1, LAST)
        assert fresh_opt.last_result.step == LAST
        for p, q in zip(fresh.parameters(), want[LAST]):
            assert torch.equal(p.detach(), q)
        fresh_opt.close()
        opt.close()


def _saved(state):
    buffer = io.BytesIO()
    torch.save({"opt": state}, buffer)
    return buffer.getvalue()


def test_a_trainer_restarted_in_a_new_process_goes_back_to_the_reference(
        two_servers, job_name, tmp_path):
    """The servers are killed with SIGKILL after step 5 and restore their
    newest checkpoint (step 5); a new trainer process loads the reference
    to step 3 from its torch.save file, and ends bitwise equal to an
    uninterrupted run."""
    servers, dirs = two_servers
    addresses = [s.address for s in servers]
    with depot.Client(addresses) as c:
        want = uninterrupted(c, job_name)
        model = worker.make_model(seed=0)
        opt = DepotOptimizer(model.parameters(), client=c, job_name=job_name,
                             **worker.OPTIONS)
        worker.train(model, opt, 1, SAVE_AT)
        checkpoint = tmp_path / "trainer.pt"
        torch.save({"opt": opt.state_dict(reference=True)}, checkpoint)
        worker.train(model, opt, SAVE_AT + 1, SAVE_AT + 2)
        assert opt.checkpoint() == SAVE_AT + 2
        opt.close()
    for s, d in enumerate(dirs):
        servers[s].process.kill()
        servers[s].process.wait()
        servers[s].stop()
        servers[s] = start(d, f"--listen={addresses[s]}")

    out = tmp_path / "params.pt"
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(
        [str(PACKAGE_DIR), str(TESTS_DIR), environment.get("PYTHONPATH", "")])
    finished = subprocess.run(
        [sys.executable, os.path.join(TESTS_DIR, "state_reference_worker.py"),
         f"--servers={','.join(addresses)}", f"--job_name={job_name}",
         f"--checkpoint={checkpoint}", f"--last_step={LAST}", f"--out={out}"],
        env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, timeout=240)
    assert finished.returncode == 0, finished.stdout
    params = torch.load(out)
    for p, q in zip(params["loaded"], want[SAVE_AT]):
        assert torch.equal(p, q)
    for p, q in zip(params["final"], want[LAST]):
        assert torch.equal(p, q)


def test_a_trainer_with_an_offload_fraction_survives_its_servers_crash(
        two_servers, job_name):
    """offload_fraction < 1, whose kept state the servers' checkpoints held
    only by value before: a reference at step 3, two more steps, then both
    servers are killed with SIGKILL and restarted (they restore their newest
    checkpoint, the reference's). The next step rolls back to step 3 by
    itself, the kept state read back from the servers (RolledBackError(3)),
    and steps 4 to 6 end bitwise like an uninterrupted run. The earlier
    reference, of step 2, stays loadable too: a patch keeps the job's
    checkpoints."""
    servers, dirs = two_servers
    addresses = [s.address for s in servers]
    kept = dict(engine="host", offload_fraction=0.5)
    with depot.Client(addresses) as c:
        want = uninterrupted(c, job_name)
        model = worker.make_model(seed=0)
        opt = DepotOptimizer(model.parameters(), client=c, job_name=job_name,
                             **kept, **worker.OPTIONS)
        worker.train(model, opt, 1, 2)
        at_2 = _saved(opt.state_dict(reference=True))
        worker.train(model, opt, 3, SAVE_AT)
        at_3 = _saved(opt.state_dict(reference=True))
        worker.train(model, opt, SAVE_AT + 1, SAVE_AT + 2)
        for s, d in enumerate(dirs):
            servers[s].process.kill()
            servers[s].process.wait()
            servers[s].stop()
            servers[s] = start(d, f"--listen={addresses[s]}")
        with pytest.raises(depot.RolledBackError) as rolled:
            worker.train(model, opt, SAVE_AT + 3, SAVE_AT + 3)
        assert rolled.value.step == SAVE_AT
        for p, q in zip(model.parameters(), want[SAVE_AT]):
            assert torch.equal(p.detach(), q)
        worker.train(model, opt, SAVE_AT + 1, LAST)
        for p, q in zip(model.parameters(), want[LAST]):
            assert torch.equal(p.detach(), q)
        opt.load_state_dict(torch.load(io.BytesIO(at_2))["opt"])
        worker.train(model, opt, 3, LAST)
        for p, q in zip(model.parameters(), want[LAST]):
            assert torch.equal(p.detach(), q)
        opt.close()


def test_a_node_of_two_local_ranks_with_an_offload_fraction_goes_back(
        two_servers, job_name):
    """A node of two local ranks keeping half the parameters' optimizer on
    the devices, each rank its own chunks' part. A reference without
    gather_state() raises ValueError naming it (a rank alone cannot write
    the other's part); after gather_state() on both ranks (which writes
    each rank's part into the servers' arrays) a reference on rank 0 holds
    the whole state: three more steps, both ranks load it, and the same
    three steps again end bitwise as the first time on both ranks."""
    import test_torch_engine as engine_tests
    servers, _ = two_servers
    with depot.Client([s.address for s in servers]) as c:
        model, inputs, targets = engine_tests.model_and_data()
        models, opts = engine_tests.node_of_two_ranks(
            model, c, job_name, weight_decay=0.1, offload_fraction=0.5)
        assert opts[0].engine.device_tensors
        engine_tests.train_two_ranks(opts, models, inputs, targets)
        with pytest.raises(ValueError, match="gather_state"):
            opts[0].state_dict(reference=True)
        with pytest.raises(ValueError, match="gather_state"):
            opts[1].checkpoint()
        engine_tests.on_two_ranks(lambda rank: opts[rank].gather_state())
        reference = _saved(opts[0].state_dict(reference=True))
        after = engine_tests.train_two_ranks(opts, models, inputs[3:],
                                             targets[3:])
        engine_tests.on_two_ranks(lambda rank: opts[rank].load_state_dict(
            torch.load(io.BytesIO(reference))["opt"]))
        again = engine_tests.train_two_ranks(opts, models, inputs[3:],
                                             targets[3:])
        for rank in range(2):
            engine_tests.assert_bitwise(again[rank], after[rank])
        for o in opts:
            o.close()


def referenced_at_2_trained_to_3(client, job_name):
    """An optimizer trained to step 3, and its reference to step 2."""
    model = worker.make_model(seed=0)
    opt = DepotOptimizer(model.parameters(), client=client, job_name=job_name,
                         **worker.OPTIONS)
    worker.train(model, opt, 1, 2)
    state = opt.state_dict(reference=True)
    worker.train(model, opt, 3, 3)
    return opt, state


def test_a_reference_to_a_pruned_checkpoint_is_not_found_and_changes_nothing(
        tmp_path, job_name):
    with start(str(tmp_path / "server"), "--checkpoint_keep=1") as server, \
            depot.Client([server.address]) as c:
        opt, state = referenced_at_2_trained_to_3(c, job_name)
        assert opt.checkpoint() == 3  # keeps only step 3: step 2 is pruned
        before = checksums(opt.job)
        with pytest.raises(depot.NotFoundError,
                           match=r"step 2 .*--checkpoint_keep"):
            opt.load_state_dict(state)
        assert checksums(opt.job) == before
        assert [s.step for s in opt.job.status()] == [3]
        opt.close()


def test_a_reference_of_another_config_or_job_is_refused(tmp_path, job_name):
    with start(str(tmp_path / "server")) as server, \
            depot.Client([server.address]) as c:
        opt, state = referenced_at_2_trained_to_3(c, job_name)
        before = checksums(opt.job)

        # Another chunk size: the servers refuse to open the job as it is.
        other = worker.make_model(seed=0)
        options = dict(worker.OPTIONS, chunk_elems=1 << 16)
        with pytest.raises(depot.FailedPreconditionError,
                           match="chunk_elems"):
            DepotOptimizer(other.parameters(), client=c, job_name=job_name,
                           **options).load_state_dict(state)
        # Other betas: the same, naming the field.
        with pytest.raises(depot.FailedPreconditionError,
                           match="adam_beta1: 0.9 .* vs 0.8"):
            DepotOptimizer(other.parameters(), client=c, job_name=job_name,
                           betas=(0.8, 0.999),
                           **worker.OPTIONS).load_state_dict(state)
        # A reference whose fingerprint is not the job's.
        wrong = dict(state, depot_reference=dict(
            state["depot_reference"],
            fingerprint=state["depot_reference"]["fingerprint"] ^ 1))
        with pytest.raises(depot.FailedPreconditionError,
                           match="fingerprint"):
            opt.load_state_dict(wrong)
        # A reference to another job.
        with pytest.raises(ValueError, match="refers to a checkpoint of job"):
            DepotOptimizer(other.parameters(), client=c,
                           job_name=f"{job_name}-other",
                           **worker.OPTIONS).load_state_dict(state)
        assert checksums(opt.job) == before
        opt.close()


def test_a_reference_whose_servers_lost_the_job_says_so(tmp_path, job_name):
    """The server is restarted on an empty --checkpoint_dir: the job opens
    empty, at step 0, and cannot go back to the referenced step."""
    with start(str(tmp_path / "server")) as server, \
            depot.Client([server.address]) as c:
        opt, state = referenced_at_2_trained_to_3(c, job_name)
        opt.close()
    with start(str(tmp_path / "empty")) as server, \
            depot.Client([server.address]) as c:
        model = worker.make_model(seed=0)
        opt = DepotOptimizer(model.parameters(), client=c, job_name=job_name,
                             **worker.OPTIONS)
        with pytest.raises(depot.FailedPreconditionError,
                           match=r"back to step 2.*step 0 has lost the job"):
            opt.load_state_dict(state)
        opt.close()


def test_reference_waits_for_a_periodic_checkpoint_being_written(
        tmp_path, job_name):
    """A checkpoint every step, written slowly (a 12 MB shard at 4 MB/s): the
    reference's checkpoint waits for the one being written, not UNAVAILABLE."""
    with start(str(tmp_path / "server"), "--checkpoint_every_steps=1",
               "--checkpoint_write_bytes_per_second=4000000") as server, \
            depot.Client([server.address]) as c:
        model = worker.make_model(seed=0)
        opt = DepotOptimizer(model.parameters(), client=c, job_name=job_name,
                             **worker.OPTIONS)
        worker.train(model, opt, 1, 2)
        with pytest.raises(depot.UnavailableError, match="being taken"):
            opt.job.checkpoint()  # what the reference would have met
        assert opt.state_dict(reference=True)["depot_reference"]["step"] == 2
        opt.close()


def test_reference_without_a_checkpoint_dir_names_the_flag(client, job_name):
    model = worker.make_model(seed=0)
    opt = DepotOptimizer(model.parameters(), client=client,
                         job_name=job_name, **worker.OPTIONS)
    worker.train(model, opt, 1, 1)
    with pytest.raises(depot.FailedPreconditionError,
                       match=r"--checkpoint_dir.*state_dict\(\)"):
        opt.state_dict(reference=True)
    assert opt.state_dict()["depot_state"].numel() > 12 * 1_000_000
    opt.job.delete()
    opt.close()
