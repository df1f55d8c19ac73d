"""The thin layer over the generated stubs: what a person would write."""

import json
import os
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, List, Optional, Union

import grpc
from google.protobuf import json_format

from . import _stubs

pb, rpc = _stubs.load()

_BACKENDS = {
    "local": pb.BACKEND_LOCAL,
    "docker": pb.BACKEND_DOCKER,
    "ssh": pb.BACKEND_SSH,
    "e2b": pb.BACKEND_E2B,
    "modal": pb.BACKEND_MODAL,
    "k8s": pb.BACKEND_K8S,
}
_BACKEND_NAMES = {v: k for k, v in _BACKENDS.items()}
_JOB_STATES = {
    pb.JOB_STARTING: "starting",
    pb.JOB_RUNNING: "running",
    pb.JOB_EXITED: "exited",
    pb.JOB_KILLED: "killed",
    pb.JOB_LOST: "lost",
    pb.JOB_FAILED: "failed",
    pb.JOB_UNKNOWN: "unknown",
}
_FINAL = {"exited", "killed", "lost", "failed"}
_APPROVAL_STATES = {
    pb.APPROVAL_PENDING: "pending",
    pb.APPROVAL_APPROVED: "approved",
    pb.APPROVAL_DENIED: "denied",
    pb.APPROVAL_EXPIRED: "expired",
}
_SIGNALS = {"TERM": pb.SIGNAL_TERM, "INT": pb.SIGNAL_INT, "KILL": pb.SIGNAL_KILL}


class BerthError(Exception):
    """A call berth refused or could not carry out; `code` is the gRPC status."""

    def __init__(self, message: str, code: Optional[grpc.StatusCode] = None):
        super().__init__(message)
        self.code = code


class Denied(BerthError):
    """A policy refused the call; the message names the rule."""


def _error(e: grpc.RpcError) -> BerthError:
    code = e.code() if hasattr(e, "code") else None
    text = e.details() if hasattr(e, "details") else str(e)
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return Denied(text, code)
    return BerthError(text, code)


def _call(fn, request, **kw):
    try:
        return fn(request, **kw)
    except grpc.RpcError as e:
        raise _error(e) from None


def _resuming(open_stream, retry_for: Optional[float]):
    """The items of a server stream; when the server stops under it
    (UNAVAILABLE), `open_stream()` is called again, for up to `retry_for`
    seconds since the last item (None: never), and the caller, which keeps
    the position reached, asks from there: nothing is lost or comes twice."""
    given_up_at = None
    while True:
        try:
            for item in open_stream():
                given_up_at = None
                yield item
            return
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.UNAVAILABLE or retry_for is None:
                raise _error(e) from None
            now = time.monotonic()
            given_up_at = given_up_at or now + retry_for
            if now > given_up_at:
                raise _error(e) from None
            time.sleep(0.2)


def _backend(name: str) -> int:
    try:
        return _BACKENDS[name]
    except KeyError:
        raise BerthError(
            f"backend {name!r} is not one berth knows: use one of {', '.join(_BACKENDS)}"
        ) from None


def _settings(
    backend: str,
    name: str,
    *,
    network: Union[bool, str] = False,
    image: Optional[str] = None,
    env: Optional[dict] = None,
    memory_mb: Optional[int] = None,
    cpus: Optional[float] = None,
    pids: Optional[int] = None,
    options: Optional[dict] = None,
):
    """A CreateSandbox request: a sandbox's settings, as `Sandbox.create`
    and `Client.create_pool` take them."""
    rules = None
    if isinstance(network, str):
        mode, _, hosts = network.partition(":")
        if mode == "allow":
            rules = pb.NetworkRules(allow=[h.strip() for h in hosts.split(",") if h.strip()])
            network = False
        elif mode in ("on", "open") and not hosts:
            network = True
        elif mode in ("off", "none") and not hosts:
            network = False
        else:
            raise ValueError(
                f"network {network!r}: use False, True, 'off', 'on' or 'allow:HOST,HOST'"
            )
    req = pb.CreateSandbox(
        sandbox=pb.SandboxRef(backend=_backend(backend), name=name),
        network=bool(network),
        env=env or {},
        options=options or {},
    )
    if rules is not None:
        req.network_rules.CopyFrom(rules)
    if image is not None:
        req.image = image
    if memory_mb is not None:
        req.memory_mb = memory_mb
    if cpus is not None:
        req.milli_cpu = int(round(cpus * 1000))
    if pids is not None:
        req.pids = pids
    return req


def _pool(p) -> dict:
    """A pool as a dict."""
    return {
        "name": p.name,
        "backend": _BACKEND_NAMES.get(p.backend, ""),
        "size": p.size,
        "ready": p.ready,
        "making": p.making,
        "image": p.image if p.HasField("image") else None,
        "network": p.network,
        "memory_mb": p.memory_mb if p.HasField("memory_mb") else None,
        "options": dict(p.options),
    }


class Client:
    """A connection to the user's `berth serve`."""

    def __init__(self, socket: str):
        self.socket = socket
        self.channel = grpc.insecure_channel(
            "unix:" + socket,
            options=[
                # gRPC names a unix socket's path as the HTTP/2 authority,
                # which is not a valid one; the server's HTTP/2 refuses it.
                ("grpc.default_authority", "localhost"),
                ("grpc.max_receive_message_length", 20 * 1024 * 1024),
                ("grpc.max_send_message_length", 20 * 1024 * 1024),
            ],
        )
        self.sandboxes = rpc.SandboxesStub(self.channel)
        self.commands = rpc.CommandsStub(self.channel)
        self.files = rpc.FilesStub(self.channel)
        self.jobs = rpc.JobsStub(self.channel)
        self.approvals_api = rpc.ApprovalsStub(self.channel)
        self.events_api = rpc.EventsStub(self.channel)

    def close(self):
        self.channel.close()

    def sandbox(self, name: str = "default", backend: str = "local", **settings) -> "Sandbox":
        """Make sandbox `name` (or attach to it) and return it."""
        return Sandbox.create(name, backend=backend, client=self, **settings)

    def list_sandboxes(self, backend: str = "local") -> List["Sandbox"]:
        r = _call(self.sandboxes.List, pb.ListSandboxes(backend=_backend(backend)))
        return [
            Sandbox(self, s.sandbox.name, _BACKEND_NAMES.get(s.sandbox.backend, backend), s.state)
            for s in r.sandboxes
        ]

    def create_pool(self, name: str, backend: str = "docker", size: int = 2, wait: bool = True, **settings) -> dict:
        """Keep `size` sandboxes of `backend` (docker or k8s) made ahead, with
        `settings` as for `Sandbox.create`; `Sandbox.create(..., from_pool=name)`
        takes one. Returns the pool (`ready`, `size`, ...)."""
        req = pb.CreatePoolRequest(name=name, size=size, wait=wait)
        req.settings.CopyFrom(_settings(backend, "", **settings))
        return _pool(_call(self.sandboxes.CreatePool, req))

    def pools(self) -> List[dict]:
        return [_pool(p) for p in _call(self.sandboxes.Pools, pb.ListPools()).pools]

    def remove_pool(self, name: str) -> List[str]:
        """Remove a pool and its sandboxes not yet taken; returns those."""
        return list(_call(self.sandboxes.RemovePool, pb.PoolRef(name=name)).members)

    def approvals(self, all: bool = False) -> List["Approval"]:
        """Approvals: the pending ones, or with `all` every one."""
        r = _call(self.approvals_api.List, pb.ListApprovals(all=all))
        return [Approval._of(self, a) for a in r.approvals]

    def job(self, id: str) -> "Job":
        return Job(self, _call(self.jobs.Get, pb.JobRef(id=id)))

    def events(
        self, limit: int = 20, kind: str = "", after: Optional[int] = None
    ) -> List["Event"]:
        """The newest `limit` events (kinds starting with `kind`), or with
        `after` the first `limit` after that id; oldest first."""
        q = pb.EventQuery(limit=limit, kind_prefix=kind)
        if after is not None:
            q.after = after
        return [Event._of(e) for e in _call(self.events_api.Query, q).events]

    def follow_events(
        self, kind: str = "", after: Optional[int] = None, retry_for: float = 30.0
    ) -> Iterator["Event"]:
        """Every event after `after` (default: from now), as each is written,
        for as long as the caller iterates. A server that stops meanwhile is
        followed on from the last event (for up to `retry_for` seconds)."""
        if after is None:
            newest = self.events(limit=1)
            after = newest[-1].id if newest else 0
        at = [after]

        def follow():
            return self.events_api.Follow(pb.FollowEvents(kind_prefix=kind, after=at[0]))

        for e in _resuming(follow, retry_for):
            at[0] = e.id
            yield Event._of(e)


_default: Optional[Client] = None
_default_lock = threading.Lock()


def connect(state_dir: Optional[str] = None, berth: Optional[str] = None) -> Client:
    """Connect to the user's berth server, starting one if none runs.

    `berth` is the CLI to ask (default: `$BERTH_BIN`, else `berth` on PATH);
    `state_dir` picks another state dir than the CLI's default.
    """
    exe = berth or os.environ.get("BERTH_BIN") or "berth"
    env = dict(os.environ)
    if state_dir is not None:
        env["BERTH_STATE_DIR"] = state_dir
    try:
        out = subprocess.run(
            [exe, "server", "start", "--json"],
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
        )
    except FileNotFoundError:
        raise BerthError(
            f"cannot run the berth CLI ({exe!r}): install berth, or name it with BERTH_BIN"
        ) from None
    if out.returncode != 0:
        raise BerthError(f"`berth server start` failed: {out.stderr.strip() or out.stdout.strip()}")
    status = json.loads(out.stdout)
    return Client(status["socket"])


def _client(client: Optional[Client]) -> Client:
    global _default
    if client is not None:
        return client
    with _default_lock:
        if _default is None:
            _default = connect()
        return _default


def approvals(all: bool = False, client: Optional[Client] = None) -> List["Approval"]:
    """The approvals of the default connection."""
    return _client(client).approvals(all)


def events(limit: int = 20, kind: str = "", client: Optional[Client] = None) -> List["Event"]:
    """The newest events of the default connection."""
    return _client(client).events(limit=limit, kind=kind)


@dataclass
class ExecResult:
    """A finished command."""

    exit_code: int
    stdout: str
    stderr: Optional[str]
    cwd: Optional[str]
    timed_out: bool
    interrupted: bool
    duration_ms: int
    call_id: str
    notices: List[str] = field(default_factory=list)
    spool: Optional[str] = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


@dataclass
class Event:
    """One entry of berth's event log."""

    id: int
    ts_ms: int
    kind: str
    call_id: Optional[str]
    backend: Optional[str]
    sandbox: Optional[str]
    command: Optional[str]
    exit_code: Optional[int]
    duration_ms: Optional[int]
    detail: Any

    @classmethod
    def _of(cls, e) -> "Event":
        def opt(name):
            return getattr(e, name) if e.HasField(name) else None

        return cls(
            id=e.id,
            ts_ms=e.ts_ms,
            kind=e.kind,
            call_id=opt("call_id"),
            backend=_BACKEND_NAMES.get(e.backend) if e.backend else None,
            sandbox=opt("sandbox"),
            command=opt("command"),
            exit_code=opt("exit_code"),
            duration_ms=opt("duration_ms"),
            detail=json_format.MessageToDict(e.detail) if e.HasField("detail") else None,
        )


@dataclass
class Checkpoint:
    id: str
    label: Optional[str]
    created_ms: int
    files: int
    bytes: int

    @classmethod
    def _of(cls, c) -> "Checkpoint":
        return cls(
            c.id, c.label if c.HasField("label") else None, c.created_ms, c.files, c.bytes
        )


class Sandbox:
    """A sandbox and its persistent shell: cwd, environment, functions and a
    venv carry from one `exec` to the next."""

    def __init__(self, client: Client, name: str, backend: str, state: str = "", workdir: str = ""):
        self.client = client
        self.name = name
        self.backend = backend
        self.state = state
        self.workdir = workdir
        # The warm pool member it was taken from, if it was.
        self.pool_member: Optional[str] = None

    def __repr__(self):
        return f"Sandbox({self.name!r}, backend={self.backend!r})"

    @property
    def _ref(self):
        return pb.SandboxRef(backend=_backend(self.backend), name=self.name)

    @classmethod
    def create(
        cls,
        name: str = "default",
        backend: str = "local",
        *,
        network: Union[bool, str] = False,
        image: Optional[str] = None,
        env: Optional[dict] = None,
        memory_mb: Optional[int] = None,
        cpus: Optional[float] = None,
        pids: Optional[int] = None,
        options: Optional[dict] = None,
        from_pool: Optional[str] = None,
        client: Optional[Client] = None,
    ) -> "Sandbox":
        """Make sandbox `name` on `backend`, or attach to the one of that name
        (whose settings must then agree).

        `network`: False or "off", True or "on" (the host's network), or
        "allow:HOST,HOST" (no route of its own, only berth's egress proxy,
        letting through the hosts named; docker).

        `from_pool`: take it from this warm pool (`Client.create_pool`), on
        the pool's backend with the pool's settings; `pool_member` then names
        the member taken (None: none was ready, and it was made now)."""
        c = _client(client)
        if from_pool is not None:
            req = pb.CreateSandbox(sandbox=pb.SandboxRef(name=name), from_pool=from_pool)
            r = _call(c.sandboxes.Create, req)
            backend = _BACKEND_NAMES.get(r.sandbox.backend, backend)
            sb = cls(c, name, backend, r.state, r.workdir)
            sb.pool_member = r.pool_member if r.HasField("pool_member") else None
            return sb
        req = _settings(backend, name, network=network, image=image, env=env,
                        memory_mb=memory_mb, cpus=cpus, pids=pids, options=options)
        r = _call(c.sandboxes.Create, req)
        return cls(c, name, backend, r.state, r.workdir)

    def exec(
        self,
        command: str,
        *,
        timeout: Optional[float] = None,
        session: str = "",
        stdin: Optional[Union[bytes, str]] = None,
        split_stderr: bool = True,
        on_output: Optional[Callable[[bytes, bool], None]] = None,
        on_notice: Optional[Callable[[str], None]] = None,
    ) -> ExecResult:
        """Run `command` in the sandbox's session and wait for it.

        `on_output(chunk, is_stderr)` sees output as it comes; the result
        holds it too (head and tail when long). A command the policy refuses
        raises `Denied`; one that waits for an approval blocks until it is
        answered (`on_notice` is told).
        """
        req = pb.ExecRequest(
            sandbox=self._ref, command=command, session=session, split_stderr=split_stderr
        )
        if timeout is not None:
            req.timeout_secs = float(timeout)
        if stdin is not None:
            req.stdin = stdin.encode() if isinstance(stdin, str) else stdin
        try:
            for ev in self.client.commands.Exec(req):
                kind = ev.WhichOneof("event")
                if kind == "stdout" and on_output:
                    on_output(ev.stdout, False)
                elif kind == "stderr" and on_output:
                    on_output(ev.stderr, True)
                elif kind == "notice" and on_notice:
                    on_notice(ev.notice)
                elif kind == "failure":
                    f = ev.failure
                    raise (Denied if f.denied else BerthError)(f.message)
                elif kind == "result":
                    r = ev.result
                    return ExecResult(
                        exit_code=r.exit_code,
                        stdout=r.stdout,
                        stderr=r.stderr if r.HasField("stderr") else None,
                        cwd=r.cwd if r.HasField("cwd") else None,
                        timed_out=r.timed_out,
                        interrupted=r.interrupted,
                        duration_ms=r.duration_ms,
                        call_id=r.call_id,
                        notices=list(r.notices),
                        spool=r.spool if r.HasField("spool") else None,
                    )
        except grpc.RpcError as e:
            raise _error(e) from None
        raise BerthError("the server ended the call without a result: is it still running?")

    def read_file(self, path: str) -> bytes:
        """A file's bytes (relative paths start at the workspace)."""
        return _call(self.client.files.Read, pb.ReadFile(sandbox=self._ref, path=path)).data

    def write_file(self, path: str, data: Union[bytes, str], mode: int = 0) -> str:
        """Create or replace a file; returns its absolute path."""
        if isinstance(data, str):
            data = data.encode()
        r = _call(
            self.client.files.Write, pb.WriteFile(sandbox=self._ref, path=path, data=data, mode=mode)
        )
        return r.path

    def start_job(
        self, command: str, *, name: Optional[str] = None, watch: Optional[List[str]] = None,
        session: str = "", pty: Optional[tuple] = None,
    ) -> "Job":
        """Start `command` detached: it outlives this program and the server.
        `pty=(cols, rows)` runs it on a terminal of its own."""
        req = pb.StartJob(sandbox=self._ref, command=command, watch=watch or [], session=session)
        if name:
            req.name = name
        if pty is not None:
            req.pty.cols, req.pty.rows = pty
        return Job(self.client, _call(self.client.jobs.Start, req))

    def jobs(self) -> List["Job"]:
        r = _call(self.client.jobs.List, pb.ListJobs(sandbox=self._ref))
        return [Job(self.client, j) for j in r.jobs]

    def checkpoint(self, label: Optional[str] = None) -> Checkpoint:
        req = pb.TakeCheckpoint(sandbox=self._ref)
        if label is not None:
            req.label = label
        return Checkpoint._of(_call(self.client.sandboxes.Checkpoint, req))

    def checkpoints(self) -> List[Checkpoint]:
        r = _call(self.client.sandboxes.Checkpoints, self._ref)
        return [Checkpoint._of(c) for c in r.checkpoints]

    def restore(self, checkpoint: Union[Checkpoint, str], force: bool = False) -> Checkpoint:
        """Put the workspace and the sessions' state back as `checkpoint` has them."""
        ref = checkpoint.id if isinstance(checkpoint, Checkpoint) else checkpoint
        r = _call(
            self.client.sandboxes.Restore,
            pb.RestoreCheckpoint(sandbox=self._ref, checkpoint=ref, force=force),
        )
        return Checkpoint._of(r.checkpoint)

    def allow_host(self, host: str) -> dict:
        """Let `host` through a sandbox made with network="allow:...",
        while it runs. Returns the rules: {"allow": [...], "deny": [...]}."""
        return self._set_network(True, host)

    def deny_host(self, host: str) -> dict:
        """Refuse `host` for a sandbox made with network="allow:...", while
        it runs. Returns the rules."""
        return self._set_network(False, host)

    def _set_network(self, allow: bool, host: str) -> dict:
        r = _call(
            self.client.sandboxes.SetNetwork,
            pb.NetworkChange(sandbox=self._ref, allow=allow, host=host),
        )
        return {"allow": list(r.allow), "deny": list(r.deny)}

    def remove(self, keep_workspace: bool = False):
        _call(
            self.client.sandboxes.Remove,
            pb.RemoveSandbox(sandbox=self._ref, keep_workspace=keep_workspace),
        )


class Job:
    """A background job; `state` is as last fetched (`refresh()` fetches)."""

    def __init__(self, client: Client, msg):
        self.client = client
        self._set(msg)

    def _set(self, m):
        self.id = m.id
        self.name = m.name if m.HasField("name") else None
        self.command = m.command
        self.state = _JOB_STATES.get(m.state, "unknown")
        self.exit_code = m.exit_code if m.HasField("exit_code") else None
        self.reason = m.reason if m.HasField("reason") else None
        self.output_bytes = m.output_bytes

    def __repr__(self):
        return f"Job({self.id!r}, state={self.state!r}, exit_code={self.exit_code!r})"

    @property
    def done(self) -> bool:
        return self.state in _FINAL

    def refresh(self) -> "Job":
        self._set(_call(self.client.jobs.Get, pb.JobRef(id=self.id)))
        return self

    def wait(self, timeout: Optional[float] = None) -> "Job":
        """Until it ends, or `timeout` seconds pass (then look at `state`)."""
        req = pb.WaitJob(id=self.id)
        if timeout is not None:
            req.timeout_secs = float(timeout)
        self._set(_call(self.client.jobs.Wait, req))
        return self

    def kill(self, signal: str = "TERM", grace: Optional[float] = None) -> "Job":
        req = pb.KillJob(id=self.id, signal=_SIGNALS[signal.upper().removeprefix("SIG")])
        if grace is not None:
            req.grace_secs = float(grace)
        killed = _call(self.client.jobs.Kill, req)
        self._set(killed.job)
        self.already_ended = killed.already_ended
        return self

    def send(self, data: Union[bytes, str] = b"", eof: bool = False, keys: Optional[List[str]] = None):
        """Write to its stdin, then type `keys` (`Enter`, `C-c`, `Up`, ...)."""
        if isinstance(data, str):
            data = data.encode()
        _call(self.client.jobs.Send, pb.SendInput(id=self.id, data=data, eof=eof, keys=keys or []))

    def screen(self) -> List[str]:
        """What a `pty` job's terminal shows, row by row."""
        return list(_call(self.client.jobs.Screen, pb.JobRef(id=self.id)).lines)

    def logs(self, follow: bool = False, offset: int = 0, retry_for: float = 30.0) -> Iterator[bytes]:
        """Its output from `offset`; with `follow`, until it ends.

        A server that stops while this follows is asked again from the
        offset reached (for up to `retry_for` seconds), so nothing is lost and
        nothing comes twice.
        """
        at = [offset]

        def logs():
            return self.client.jobs.Logs(pb.JobLogs(id=self.id, offset=at[0], follow=follow))

        for chunk in _resuming(logs, retry_for if follow else None):
            at[0] = chunk.offset
            yield chunk.data


class Approval:
    """A command waiting for a person's yes or no."""

    def __init__(self, client: Client, msg):
        self.client = client
        self.id = msg.id
        self.command = msg.command
        self.part = msg.part
        self.rule = msg.rule
        self.reason = msg.reason
        self.state = _APPROVAL_STATES.get(msg.state, "unknown")
        self.sandbox = msg.sandbox.name
        self.rule_added = msg.rule_added if msg.HasField("rule_added") else None

    @classmethod
    def _of(cls, client, msg):
        return cls(client, msg)

    def __repr__(self):
        return f"Approval({self.id}, {self.command!r}, state={self.state!r})"

    def allow(self, always: bool = False) -> "Approval":
        """Let it run; `always` also writes an allow rule to the policy file."""
        return self._answer(True, always)

    def deny(self) -> "Approval":
        return self._answer(False, False)

    def _answer(self, allow, always):
        m = _call(self.client.approvals_api.Answer, pb.AnswerApproval(id=self.id, allow=allow, always=always))
        return Approval(self.client, m)
