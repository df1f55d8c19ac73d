"""berth from Python: sandboxes with a persistent shell, jobs, files,
checkpoints, approvals and the event log, over berth's typed API (`berth.v1`).

    from berth import Sandbox
    sb = Sandbox.create("agent", backend="docker")
    r = sb.exec("cd app && pytest -q")    # r.exit_code, r.stdout, r.stderr, r.cwd
    job = sb.start_job("python train.py")
    for chunk in job.logs(follow=True):
        print(chunk.decode(), end="")
    sb.write_file("notes.txt", b"hi"); sb.read_file("notes.txt")
    cp = sb.checkpoint("clean"); sb.restore(cp)

The calls go to the user's `berth serve` over its unix socket; `connect()`
starts one (through the `berth` CLI) when none runs.
"""

from ._client import (
    Approval,
    BerthError,
    Checkpoint,
    Client,
    Denied,
    Event,
    ExecResult,
    Job,
    Sandbox,
    approvals,
    connect,
    events,
)

__all__ = [
    "Approval",
    "BerthError",
    "Checkpoint",
    "Client",
    "Denied",
    "Event",
    "ExecResult",
    "Job",
    "Sandbox",
    "approvals",
    "connect",
    "events",
]
