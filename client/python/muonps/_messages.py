"""Start-up errors that say which muonps service is missing and what to start."""

import re

from . import _native

_UNREACHABLE = (_native.UNAVAILABLE, _native.DEADLINE_EXCEEDED)
# A worker refuses to attach (FAILED_PRECONDITION) while the job's plan has
# another number of workers than there are trainers (StepEngine::Attach);
# the client retries until its timeout, then this is what it reports.
_PLAN_SIZE = re.compile(
    r"has (\d+) workers with trainers and (\d+) dedicated ones; the job has "
    r"(\d+) trainers and expects (\d+) dedicated")


def explain_start_error(error, coordinator, job, socket):
    """A MuonpsError from starting a client, reworded when the coordinator or
    the worker could not be reached (or the worker serves another job); any
    other error is returned as is."""
    message = str(error)
    if error.code in _UNREACHABLE and ("CreateJob" in message or
                                       "GetJob" in message):
        host, _, port = coordinator.rpartition(":")
        return _native.MuonpsError(error.code, (
            f"no muonps coordinator at {coordinator} ({message}): start "
            f"`muonps-coordinator --host {host} --port {port}` "
            "(bazel-bin/server/coordinator/) or `deploy/local/launch.sh "
            "--keep-running`, or pass coordinator='HOST:PORT'"))
    if "Attach to the worker" not in message:
        return error
    start = (f"`muonps-worker --coordinator {coordinator} --job {job} "
             f"--socket {socket}` (bazel-bin/server/worker/; one per trainer "
             "rank) or `deploy/local/launch.sh`")
    if error.code in _UNREACHABLE:
        return _native.MuonpsError(error.code, (
            f"no muonps worker at unix:{socket} ({message}): start {start}, "
            "or pass worker_socket=PATH"))
    sizes = _PLAN_SIZE.search(message)
    if error.code == _native.FAILED_PRECONDITION and sizes is not None:
        dedicated = (f" and {sizes[2]} of {sizes[4]} dedicated worker(s) "
                     "(muonps-worker --dedicated)"
                     if sizes[2] != sizes[4] else "")
        return _native.MuonpsError(error.code, (
            f"job {job!r} has {sizes[1]} worker(s) for {sizes[3]} trainers"
            f"{dedicated} ({message}); start one worker per trainer rank, "
            f"each with --job {job}: {start}"))
    if error.code == _native.FAILED_PRECONDITION:
        return _native.MuonpsError(error.code, (
            f"the muonps worker at unix:{socket} has no plan for job {job!r} "
            f"({message}): is it a worker of another job or coordinator? "
            f"Start {start}"))
    return error
