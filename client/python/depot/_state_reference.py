"""A state dict's reference to a server-side checkpoint
(DepotOptimizer.state_dict(reference=True); docs/checkpoints.md, "state_dict
by reference").

Instead of the servers' whole state, the dict holds which checkpoint to go
back to: the job's name, its config fingerprint, the step, and the servers
that hold it. The state itself stays in the servers' --checkpoint_dir, so a
torch.save of the dict is a few hundred bytes whatever the model's size.
"""

import time

import depot

# The reference's own format, for a later one to tell them apart.
FORMAT = 1
# How long take() waits for a checkpoint of the job already being taken or
# written (a periodic one) before it gives up, in seconds.
BUSY_WAIT_SECONDS = 300.0
_BUSY = "being taken or written"


def take(job, servers):
    """Has the job's servers checkpoint it now (Job.checkpoint(): every
    shard durable before it returns) and returns the reference to that
    checkpoint. A periodic checkpoint of the job still being written is
    waited for (up to BUSY_WAIT_SECONDS): a trainer that saves every 10
    steps, as the servers do, meets one each time. FailedPreconditionError
    naming the cure when a server has no --checkpoint_dir."""
    try:
        step = _checkpoint_when_free(job)
    except depot.FailedPreconditionError as e:
        if "--checkpoint_dir" not in str(e):
            raise
        raise depot.FailedPreconditionError(
            f"state_dict(reference=True) needs server-side checkpoints: start "
            f"every server of job \"{job.name}\" with --checkpoint_dir, or "
            f"save the state itself with state_dict() ({e})") from None
    return {
        "format": FORMAT,
        "job": job.name,
        "fingerprint": job.fingerprint,
        "step": step,
        "servers": list(servers),
        # The servers do not report their --checkpoint_dir: the checkpoint
        # is step-<step> of the job in each one's own directory.
        "location": None,
    }


def _checkpoint_when_free(job):
    """Job.checkpoint(), again while a server answers that a checkpoint of
    the job is being taken or written (UNAVAILABLE for that reason only: a
    server shutting down is the trainer's to handle)."""
    deadline = time.monotonic() + BUSY_WAIT_SECONDS
    pause = 0.01
    while True:
        try:
            return job.checkpoint()
        except depot.UnavailableError as e:
            if _BUSY not in str(e) or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 1.0)


def check_job_name(reference, job_name):
    """ValueError unless `reference` (from take) is a reference this
    optimizer's job can go back to: its own job, in a format this reads."""
    if reference.get("format") != FORMAT:
        raise ValueError(f"the state dict's depot_reference has format "
                         f"{reference.get('format')!r}; this version reads "
                         f"format {FORMAT}")
    if reference["job"] != job_name:
        raise ValueError(
            f"the state dict refers to a checkpoint of job "
            f"\"{reference['job']}\", and this optimizer's job is "
            f"\"{job_name}\": a reference restores only the job whose servers "
            f"hold the checkpoint (construct the optimizer with "
            f"job_name=\"{reference['job']}\", or save with state_dict() to "
            f"move the state into another job)")


def restore(job, reference, servers):
    """Brings every server of `job` back to the referenced step: in-flight
    contributions dropped, the servers' checkpoint of the step restored
    (Job.roll_back). Checked first, with nothing changed on error:
    FailedPreconditionError when the job's config is not the referenced
    one. NotFoundError when a server no longer holds the checkpoint;
    FailedPreconditionError when a server is behind the step."""
    step = int(reference["step"])
    where = _servers_note(reference, servers)
    if reference["fingerprint"] != job.fingerprint:
        raise depot.FailedPreconditionError(
            f"the state dict refers to step {step} of job \"{job.name}\" with "
            f"config fingerprint {reference['fingerprint']:#x}, and this "
            f"optimizer's job has fingerprint {job.fingerprint:#x}: the "
            f"optimizer's config (layout, optimizer, its hyperparameters, "
            f"dtypes, chunk size or number of servers) is not the one the "
            f"reference was taken with{where}")
    try:
        job.roll_back(step)
    except depot.NotFoundError as e:
        raise depot.NotFoundError(
            f"the checkpoint of step {step} of job \"{job.name}\" that the "
            f"state dict refers to is no longer on every server: servers keep "
            f"only their newest --checkpoint_keep checkpoints (it was pruned), "
            f"or the checkpoint directory was lost{where} ({e})") from None
    except depot.FailedPreconditionError as e:
        statuses = job.status()
        at = ", ".join(f"{s.server}: step {s.step}" for s in statuses)
        lost = (" (a server at step 0 has lost the job: was it restarted "
                "without its --checkpoint_dir?)"
                if any(s.step == 0 for s in statuses) else "")
        raise depot.FailedPreconditionError(
            f"job \"{job.name}\" cannot go back to step {step}, which the "
            f"state dict refers to: its servers are at {at}, and a server "
            f"behind the step cannot reach it{lost}{where} ({e})") from None
    return step


def _servers_note(reference, servers):
    """A note for errors when the reference was taken on other servers."""
    if list(reference["servers"]) == list(servers):
        return ""
    return (f" (the reference was taken on servers "
            f"{', '.join(reference['servers'])}; this optimizer's are "
            f"{', '.join(servers)})")
