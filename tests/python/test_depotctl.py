"""depotctl against three real depot-server processes (docs/operations.md,
"depotctl"): what `status` and `jobs` print as JSON, checkpoints taken,
listed and verified (a damaged file found), a rollback, a drain, a delete,
the exit codes, and tenants with TLS and tokens."""
import json
import os
import pathlib
import subprocess
import threading
import time

import numpy as np
import pytest

import depot
import server_process
from conftest import REPO_ROOT, server_binary
from test_security import ALPHA_TOKEN, BETA_TOKEN, pki  # noqa: F401 (fixture)

TENSORS = [("w", 3000, 0), ("b", 40, 0)]


def depotctl_binary():
    binary = os.environ.get("DEPOT_CTL") or str(
        REPO_ROOT / "build" / "tools" / "depotctl" / "depotctl")
    if not os.access(binary, os.X_OK):
        pytest.fail(f"depotctl not found at {binary}: build it and set "
                    f"DEPOT_CTL to its path", pytrace=False)
    return binary


def depotctl(*args, env=None):
    """Runs depotctl; returns (exit code, stdout, stderr)."""
    run = subprocess.run([depotctl_binary(), *args], capture_output=True,
                         text=True, timeout=120,
                         env={**os.environ, **(env or {})})
    return run.returncode, run.stdout, run.stderr


def depotctl_json(*args, expect=0, env=None):
    code, out, err = depotctl("--output=json", *args, env=env)
    assert code == expect, f"exit {code}\nstdout: {out}\nstderr: {err}"
    return json.loads(out)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """Three servers, each with its own checkpoint directory."""
    started, dirs = [], []
    try:
        for i in range(3):
            directory = tmp_path_factory.mktemp(f"ckpt{i}")
            dirs.append(directory)
            started.append(server_process.start_server(
                server_binary(),
                ["--threads=1", f"--checkpoint_dir={directory}"]))
        yield started, dirs
    finally:
        for server in started:
            server.stop()


def servers_flag(fleet):
    return "--servers=" + ",".join(s.address for s in fleet[0])


def train(job, steps, first=1):
    n = job.total_elems
    out = np.empty(n, dtype=np.float32)
    for step in range(first, first + steps):
        job.step(step, np.full(n, 0.01 * step, dtype=np.float32), out)
    return out


@pytest.fixture
def trained_job(fleet, job_name):
    """A job on all three servers, trained 4 steps."""
    client = depot.Client([s.address for s in fleet[0]])
    job = client.open_job(job_name, TENSORS, optimizer="adamw",
                          chunk_elems=256)
    job.init_weights(np.linspace(-1, 1, job.total_elems, dtype=np.float32))
    train(job, 4)
    yield job
    try:
        job.delete()
    except depot.DepotError:
        pass  # the test deleted it
    client.close()


def test_status_prints_what_every_server_holds(fleet, trained_job, job_name):
    status = depotctl_json(servers_flag(fleet), "--sample_seconds=0.2",
                           "status")
    assert status["reachable"] == 3 and status["unreachable"] == 0
    addresses = [s.address for s in fleet[0]]
    assert [s["address"] for s in status["servers"]] == addresses
    indices = set()
    for server in status["servers"]:
        assert server["ok"] and server["error"] is None
        assert not server["draining"]
        assert server["checkpoints_enabled"]
        assert 0 < server["memory_used_bytes"] <= server["memory_limit_bytes"]
        assert server["steps_completed"] >= 4
        assert server["uptime_seconds"] > 0
        assert server["rates"] is not None
        assert server["rates"]["steps_per_second"] >= 0
        jobs = [j for j in server["jobs"] if j["name"] == job_name]
        assert len(jobs) == 1, server["jobs"]
        job = jobs[0]
        assert job["step"] == 4 and job["newest_step"] == 4
        assert job["num_servers"] == 3 and job["num_workers"] == 1
        assert job["pending_step"] == 0 and job["missing_workers"] == []
        assert job["state_bytes"] > 0 and job["shard_params"] > 0
        indices.add(job["server_index"])
    assert indices == {0, 1, 2}
    # The table names every server and the job.
    code, out, _ = depotctl(servers_flag(fleet), "--sample_seconds=0",
                            "status")
    assert code == 0
    for address in addresses:
        assert address in out
    assert f'job "{job_name}"' in out


def test_jobs_groups_each_job_across_the_servers(fleet, trained_job,
                                                 job_name):
    jobs = depotctl_json(servers_flag(fleet), "jobs")
    mine = [j for j in jobs["jobs"] if j["name"] == job_name]
    assert len(mine) == 1
    job = mine[0]
    assert job["complete"] and job["servers_holding"] == 3
    assert job["step_min"] == job["step_max"] == 4
    total_params = sum(s["shard_params"] for s in
                       [j for srv in depotctl_json(servers_flag(fleet),
                                                   "--sample_seconds=0",
                                                   "status")["servers"]
                        for j in srv["jobs"] if j["name"] == job_name])
    assert total_params >= trained_job.total_elems
    assert sorted(s["server_index"] for s in job["shards"]) == [0, 1, 2]


def test_checkpoint_list_verify_and_a_damaged_file(fleet, trained_job,
                                                   job_name):
    taken = depotctl_json(servers_flag(fleet), "checkpoint", job_name)
    assert taken["complete"] and taken["step"] == 4
    assert [s["step"] for s in taken["servers"]] == [4, 4, 4]
    listed = depotctl_json(servers_flag(fleet), "checkpoints", "list",
                           job_name)
    assert listed["jobs"][0]["complete_steps"] == [4]
    verified = depotctl_json(servers_flag(fleet), "checkpoints", "verify",
                             job_name)
    assert verified["jobs"][0]["complete_steps"] == [4]
    # One bit flipped in server 1's shard file: verify finds it, exit 3.
    shard_files = list(pathlib.Path(fleet[1][1]).rglob("shard-1-of-3.ckpt"))
    shard_files = [f for f in shard_files if job_name in str(f)]
    assert len(shard_files) == 1, shard_files
    data = bytearray(shard_files[0].read_bytes())
    data[len(data) // 2] ^= 0x10
    shard_files[0].write_bytes(bytes(data))
    verified = depotctl_json(servers_flag(fleet), "checkpoints", "verify",
                             job_name, expect=3)
    job = verified["jobs"][0]
    assert job["complete_steps"] == []
    bad = [v for s in job["servers"] for v in s["verified"] if not v["ok"]]
    assert len(bad) == 1 and "DATA_LOSS" in bad[0]["error"]


def test_rollback_puts_every_server_back(fleet, trained_job, job_name):
    depotctl_json(servers_flag(fleet), "checkpoint", job_name)
    train(trained_job, 3, first=5)
    assert depotctl_json(servers_flag(fleet), "jobs")["jobs"][0] is not None
    # A step no server holds: refused, nothing changes.
    code, _, err = depotctl(servers_flag(fleet), "rollback", job_name, "2")
    assert code == 1 and "can not go to step 2" in err
    rolled = depotctl_json(servers_flag(fleet), "rollback", job_name, "4")
    assert rolled["ok"] and all(s["restored"] for s in rolled["servers"])
    jobs = [j for j in depotctl_json(servers_flag(fleet), "jobs")["jobs"]
            if j["name"] == job_name]
    assert jobs[0]["step_min"] == jobs[0]["step_max"] == 4
    # The trainer learns where the job is and goes on from there.
    step, _ = trained_job.reconcile()
    assert step == 4
    train(trained_job, 1, first=5)


def test_drain_refuses_new_jobs_until_resumed(fleet, trained_job, job_name):
    target = fleet[0][2].address
    drained = depotctl_json("drain", target)
    assert drained["draining"] and not drained["shutting_down"]
    names = [c["name"] for c in drained["checkpoints"]]
    assert job_name in names
    assert all(c["error"] is None for c in drained["checkpoints"])
    status = depotctl_json(f"--servers={target}", "--sample_seconds=0",
                           "status")
    assert status["servers"][0]["draining"]
    # NOT_SERVING: a client waiting for the server does not find it ready.
    with depot.Client([target]) as client:
        with pytest.raises(depot.DepotError):
            client.wait_for_servers(1.0)
        # A new job is refused, saying why.
        with pytest.raises(depot.UnavailableError, match="drained"):
            client.open_job(job_name + "-new", TENSORS, optimizer="sgd")
    # The job it holds goes on.
    train(trained_job, 1, first=5)
    resumed = depotctl_json("drain", "--resume", target)
    assert not resumed["draining"]
    with depot.Client([target]) as client:
        client.wait_for_servers(10.0)


def test_delete_needs_yes(fleet, trained_job, job_name):
    code, _, err = depotctl(servers_flag(fleet), "delete", job_name)
    assert code == 2 and "--yes" in err
    assert any(j["name"] == job_name
               for j in depotctl_json(servers_flag(fleet), "jobs")["jobs"])
    deleted = depotctl_json(servers_flag(fleet), "delete", job_name, "--yes")
    assert deleted["ok"] and len(deleted["servers"]) == 3
    assert not any(j["name"] == job_name
                   for j in depotctl_json(servers_flag(fleet), "jobs")["jobs"])


def test_exit_codes_for_scripts(fleet):
    code, _, err = depotctl(servers_flag(fleet), "checkpoint", "no-such-job")
    assert code == 4 and "no-such-job" in err
    code, _, err = depotctl(servers_flag(fleet), "frobnicate")
    assert code == 2 and "unknown command" in err
    code, _, err = depotctl("status")
    assert code == 2 and "DEPOT_SERVERS" in err
    # A server that does not answer: reported, exit 3.
    status = depotctl_json(servers_flag(fleet) + ",127.0.0.1:1",
                           "--sample_seconds=0", "--timeout_seconds=5",
                           "status", expect=3)
    assert status["unreachable"] == 1
    assert not status["servers"][3]["ok"]
    assert "UNAVAILABLE" in status["servers"][3]["error"]
    # DEPOT_SERVERS stands in for --servers.
    env = {"DEPOT_SERVERS": ",".join(s.address for s in fleet[0])}
    assert depotctl_json("jobs", env=env)["unreachable"] == 0


def test_tenants_see_their_own_jobs_and_only_admins_drain(pki):  # noqa: F811
    ca = str(pki / "ca.pem")
    server = server_process.start_server(
        server_binary(),
        [f"--tls_cert={pki / 'server.pem'}", f"--tls_key={pki / 'server.key'}",
         f"--auth_token_file={pki / 'tokens'}", "--admin_tenants=beta",
         "--threads=1"],
        client_options={"tls_ca": ca})
    try:
        with depot.Client([server.address], tls_ca=ca,
                          token=ALPHA_TOKEN) as alpha:
            job = alpha.open_job("ctl-alpha", TENSORS, optimizer="sgd")
            flags = [f"--servers={server.address}", f"--tls_ca={ca}"]
            as_alpha = {"DEPOT_TOKEN": ALPHA_TOKEN}
            as_beta = {"DEPOT_TOKEN": BETA_TOKEN}
            # Without a token: UNAUTHENTICATED, exit 3 (the server did not
            # answer the status).
            status = depotctl_json(*flags, "--sample_seconds=0", "status",
                                   expect=3)
            assert "UNAUTHENTICATED" in status["servers"][0]["error"]
            code, _, err = depotctl(f"--tls_ca={ca}", "drain", server.address)
            assert code == 1 and "UNAUTHENTICATED" in err
            mine = depotctl_json(*flags, "jobs", env=as_alpha)["jobs"]
            assert [j["name"] for j in mine] == ["ctl-alpha"]
            assert mine[0]["tenant"] == ""  # not an admin: no tenant names
            # beta is an admin: it sees alpha's job, with its tenant.
            seen = depotctl_json(*flags, "jobs", env=as_beta)["jobs"]
            assert [(j["name"], j["tenant"]) for j in seen] == [
                ("ctl-alpha", "alpha")]
            # Job names are per tenant: beta's own "ctl-alpha" is another
            # job, listed apart, and the one beta's commands act on.
            with depot.Client([server.address], tls_ca=ca,
                              token=BETA_TOKEN) as beta:
                beta.open_job("ctl-alpha", TENSORS, optimizer="adamw")
            seen = depotctl_json(*flags, "jobs", env=as_beta)["jobs"]
            assert [(j["name"], j["tenant"]) for j in seen] == [
                ("ctl-alpha", "alpha"), ("ctl-alpha", "beta")]
            assert len({j["shards"][0]["job_id"] for j in seen}) == 2
            deleted = depotctl_json(*flags, "delete", "ctl-alpha", "--yes",
                                    env=as_beta)
            seen = depotctl_json(*flags, "jobs", env=as_beta)["jobs"]
            assert [(j["name"], j["tenant"]) for j in seen] == [
                ("ctl-alpha", "alpha")], deleted
            code, _, err = depotctl(*flags, "drain", server.address,
                                    env=as_alpha)
            assert code == 1 and "PERMISSION_DENIED" in err
            assert depotctl_json(f"--tls_ca={ca}", "drain", server.address,
                                 env=as_beta)["draining"]
            job.delete()
    finally:
        server.stop()


def test_import_restores_a_checkpoint_onto_another_server_count(
        fleet, trained_job, job_name, tmp_path):
    taken = depotctl_json(servers_flag(fleet), "checkpoint", job_name)
    assert taken["complete"] and taken["step"] == 4
    dirs = ",".join(str(d) for d in fleet[1])
    # The new servers may read the old servers' directories (--import_roots).
    new = [server_process.start_server(
        server_binary(), ["--threads=1", f"--import_roots={dirs}"])
        for _ in range(2)]
    try:
        flag = "--servers=" + ",".join(s.address for s in new)
        client = depot.Client([s.address for s in new])
        moved = client.open_job(job_name, TENSORS, optimizer="adamw",
                                chunk_elems=256)
        # A step no server wrote: verified first, nothing changes.
        code, _, err = depotctl(flag, "import", job_name, "3", f"--from={dirs}")
        assert code == 1 and "nothing imported" in err
        code, _, err = depotctl(flag, "import", job_name, "4")
        assert code == 2 and "--from" in err
        imported = depotctl_json(flag, "import", job_name, "4",
                                 f"--from={dirs}")
        assert imported["ok"] and imported["step"] == 4
        assert all(s["old_num_servers"] == 3 for s in imported["servers"])
        # Both runs go on from step 4 to the same bits.
        assert np.array_equal(train(trained_job, 1, first=5),
                              train(moved, 1, first=5))
        moved.delete()
        client.close()
    finally:
        for server in new:
            server.stop()


def test_drain_shutdown_stops_a_server_only_once_its_jobs_are_saved(
        tmp_path):
    """While a step waits for a worker the job cannot be checkpointed, so
    `drain --shutdown` leaves the server up (stopping it would lose the job's
    steps since its last checkpoint); once the step is done it checkpoints
    the job and stops."""
    server = server_process.start_server(
        server_binary(), ["--threads=1", f"--checkpoint_dir={tmp_path}"])
    try:
        clients = [depot.Client([server.address]) for _ in range(2)]
        jobs = [clients[rank].open_job("ctl-shutdown", TENSORS,
                                       optimizer="sgd", num_workers=2,
                                       worker_rank=rank, chunk_elems=256)
                for rank in range(2)]
        n = jobs[0].total_elems
        jobs[0].init_weights(np.zeros(n, dtype=np.float32))
        outs = [np.empty(n, dtype=np.float32) for _ in range(2)]
        waiting = threading.Thread(target=lambda: jobs[0].step(
            1, np.full(n, 0.5, dtype=np.float32), outs[0]))
        waiting.start()
        flag = f"--servers={server.address}"
        deadline = time.monotonic() + 30
        while depotctl_json(flag, "jobs")["jobs"][0]["missing_workers"] != [1]:
            assert time.monotonic() < deadline, "step 1 never waited"
        code, out, err = depotctl("--output=json", "drain", "--shutdown",
                                  server.address)
        assert code == 1 and "NOT shut down" in err, (out, err)
        assert not json.loads(out)["shutting_down"]
        assert server.process.poll() is None  # still up, drained
        jobs[1].step(1, np.full(n, 0.25, dtype=np.float32), outs[1])
        waiting.join()
        drained = depotctl_json("drain", "--shutdown", server.address)
        assert drained["shutting_down"]
        assert [(c["name"], c["step"]) for c in drained["checkpoints"]] == [
            ("ctl-shutdown", 1)]
        assert server.process.wait(timeout=60) == 0
        for client in clients:
            client.close()
    finally:
        server.stop()
