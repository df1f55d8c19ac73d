"""The Python SDK against a real `berth serve`, on the local and docker backends.

Run by tests/sdk.rs (cargo nextest) with BERTH_BIN set to the built CLI; by
hand: BERTH_BIN=target/debug/berth python3 -m pytest sdk/python/tests
"""

import os
import shutil
import subprocess
import tempfile
import threading
import time
import uuid

import pytest

import berth
from berth import BerthError, Denied, Sandbox

POLICY = """
[[rules]]
name = "ask-touch"
action = "ask"
prefix = "touch"
reason = "touching needs a yes"

[[rules]]
name = "no-rm"
action = "deny"
prefix = "rm"
reason = "nothing is deleted here"

[approvals]
timeout_secs = 120
"""

BACKENDS = ["local", "docker"]


def _berth():
    exe = os.environ.get("BERTH_BIN")
    if not exe:
        pytest.fail("set BERTH_BIN to the berth CLI to test (tests/sdk.rs does)")
    return exe


@pytest.fixture(scope="module")
def client():
    state = tempfile.mkdtemp(prefix="berth-sdk-")
    policy = os.path.join(state, "policy.toml")
    with open(policy, "w") as f:
        f.write(POLICY)
    saved = {k: os.environ.get(k) for k in ("BERTH_STATE_DIR", "BERTH_POLICY", "BERTH_SERVER")}
    os.environ.update(BERTH_STATE_DIR=state, BERTH_POLICY=policy, BERTH_SERVER="auto")
    c = berth.connect(berth=_berth())
    made = []
    c.made = made
    yield c
    for sb in made:
        try:
            sb.remove()
        except BerthError:
            pass
    c.close()
    subprocess.run([_berth(), "server", "stop"], stdin=subprocess.DEVNULL, capture_output=True)
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    shutil.rmtree(state, ignore_errors=True)


def _sandbox(client, backend):
    sb = Sandbox.create("sdk-" + uuid.uuid4().hex[:8], backend=backend, client=client)
    client.made.append(sb)
    return sb


@pytest.mark.parametrize("backend", BACKENDS)
def test_exec_keeps_the_sessions_state(client, backend):
    sb = _sandbox(client, backend)
    first = sb.exec("cd /tmp && export SDK_X=41 && bump() { echo $((SDK_X + 1)); }")
    assert first.exit_code == 0, first
    assert first.cwd == "/tmp"
    r = sb.exec("echo $SDK_X; bump; pwd; echo oops >&2; exit 3")
    assert r.exit_code == 3
    assert r.stdout == "41\n42\n/tmp\n"
    assert r.stderr == "oops\n"
    seen = []
    r = sb.exec("printf 'a\\nb\\n'", on_output=lambda b, err: seen.append((b, err)))
    assert b"".join(b for b, _ in seen) == b"a\nb\n"
    assert r.ok


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_jobs_logs_are_followed_to_the_end(client, backend):
    sb = _sandbox(client, backend)
    job = sb.start_job("for i in 1 2 3; do echo line$i; sleep 0.3; done; exit 4", name="counter")
    assert job.state in ("starting", "running"), job
    out = b"".join(job.logs(follow=True))
    assert out == b"line1\nline2\nline3\n"
    job.wait(timeout=30)
    assert (job.state, job.exit_code) == ("exited", 4)
    # Again from an offset: only what follows it.
    assert b"".join(job.logs(offset=6)) == b"line2\nline3\n"
    assert any(j.id == job.id for j in sb.jobs())


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_file_makes_the_round_trip(client, backend):
    sb = _sandbox(client, backend)
    blob = bytes(range(256)) * 1000
    path = sb.write_file("data/blob.bin", blob)
    assert path.endswith("/data/blob.bin")
    assert sb.read_file("data/blob.bin") == blob
    assert sb.exec("wc -c < data/blob.bin").stdout.strip() == str(len(blob))
    sb.exec("printf shell > made-by-shell.txt")
    assert sb.read_file("made-by-shell.txt") == b"shell"
    with pytest.raises(BerthError):
        sb.read_file("no/such/file")


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_checkpoint_is_restored(client, backend):
    sb = _sandbox(client, backend)
    sb.write_file("a.txt", "one")
    sb.exec("export SDK_STAGE=clean")
    cp = sb.checkpoint("clean")
    assert cp.label == "clean" and cp.files >= 1
    sb.write_file("a.txt", "two")
    sb.write_file("b.txt", "new")
    sb.exec("export SDK_STAGE=dirty")
    back = sb.restore("clean")
    assert back.id == cp.id
    assert sb.read_file("a.txt") == b"one"
    assert sb.exec("test -e b.txt").exit_code == 1
    assert sb.exec("echo $SDK_STAGE").stdout == "clean\n"
    assert [c.id for c in sb.checkpoints()] == [cp.id]


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_ask_is_answered_through_the_sdk(client, backend):
    sb = _sandbox(client, backend)
    marker = "asked-" + uuid.uuid4().hex[:6]
    result = {}
    notices = []

    def run():
        try:
            result["r"] = sb.exec(f"touch {marker}", on_notice=notices.append)
        except BaseException as e:  # reported below
            result["e"] = e

    t = threading.Thread(target=run)
    t.start()
    pending = []
    end = time.monotonic() + 60
    while not pending and time.monotonic() < end:
        pending = [a for a in client.approvals() if marker in a.command]
        time.sleep(0.1)
    assert pending, "the command never asked for an approval"
    ap = pending[0]
    assert (ap.rule, ap.state, ap.sandbox) == ("ask-touch", "pending", sb.name)
    assert ap.allow().state == "approved"
    t.join(60)
    assert "e" not in result, result.get("e")
    assert result["r"].exit_code == 0
    assert notices, "the waiting call was told nothing"
    assert sb.exec(f"test -f {marker}").exit_code == 0
    assert not [a for a in client.approvals() if marker in a.command]


def test_a_refusal_names_its_rule_and_the_session_goes_on(client):
    sb = _sandbox(client, "local")
    sb.exec("export KEEP=yes")
    with pytest.raises(Denied) as e:
        sb.exec("rm -f anything")
    assert "no-rm" in str(e.value)
    assert sb.exec("echo $KEEP").stdout == "yes\n"


def test_bad_input_gets_an_error_that_says_what_to_do(client):
    with pytest.raises(BerthError) as e:
        Sandbox.create("x", backend="nope", client=client)
    assert "local" in str(e.value)
    sb = _sandbox(client, "local")
    with pytest.raises(BerthError) as e:
        sb.exec("   ")
    assert e.value.code.name == "INVALID_ARGUMENT"
    with pytest.raises(BerthError) as e:
        sb.exec("true", timeout=-1)
    assert "positive" in str(e.value)
    with pytest.raises(BerthError) as e:
        client.job("j-no-such-job")
    assert e.value.code.name == "NOT_FOUND", e.value
    with pytest.raises(BerthError) as e:
        berth.Approval(client, berth._client.pb.Approval(id=999999)).allow()
    assert e.value.code.name == "NOT_FOUND", e.value
    # Allow rules on a backend that cannot put berth's proxy in front of
    # the sandbox: refused, saying why, never a sandbox with the network on.
    with pytest.raises(BerthError) as e:
        Sandbox.create("x-net", "ssh", network="allow:pypi.org", client=client)
    assert "own network and firewall apply" in str(e.value), e.value
    with pytest.raises(ValueError):
        Sandbox.create("x-net", "local", network="sometimes", client=client)
    # A hung command ends at its timeout; the session stays usable.
    r = sb.exec("sleep 30", timeout=0.5)
    assert (r.exit_code, r.timed_out) == (124, True)
    assert sb.exec("echo still").stdout == "still\n"


def test_the_event_log_is_queried_and_followed(client):
    sb = _sandbox(client, "local")
    r = sb.exec("echo logged; exit 5")
    mine = [e for e in client.events(limit=200, kind="exec.finished") if e.call_id == r.call_id]
    assert len(mine) == 1, mine
    assert (mine[0].exit_code, mine[0].sandbox, mine[0].backend) == (5, sb.name, "local")
    # A page after an id holds only later events, oldest first.
    later = client.events(limit=5, after=mine[0].id)
    assert all(e.id > mine[0].id for e in later)
    assert [e.id for e in later] == sorted(e.id for e in later)
    # A follower sees a job's start, its watch match (a structured detail)
    # and its end, each once, as they happen.
    seen = []

    def follow():
        for e in client.follow_events(kind="job."):
            seen.append(e)
            if e.kind == "job.exited":
                return

    t = threading.Thread(target=follow, daemon=True)
    t.start()
    time.sleep(0.5)
    job = sb.start_job("echo needle; sleep 1.5; exit 2", watch=["^needle$"])
    t.join(timeout=60)
    assert not t.is_alive(), f"no job.exited seen: {seen}"
    ours = [e for e in seen if e.call_id == job.id]
    kinds = [e.kind for e in ours]
    assert kinds.count("job.started") == 1 and kinds.count("job.exited") == 1, kinds
    watch = [e for e in ours if e.kind == "job.watch"]
    assert len(watch) == 1 and watch[0].detail["detail"]["line"] == "needle", watch
    assert len({e.id for e in seen}) == len(seen)


def test_a_terminal_job_is_typed_into_read_and_killed(client):
    sb = _sandbox(client, "local")
    job = sb.start_job("read -r x; echo got:$x; sleep 60", pty=(100, 30))
    job.send("hello", keys=["Enter"])
    deadline = time.monotonic() + 30
    screen = []
    while time.monotonic() < deadline:
        screen = job.screen()
        if any("got:hello" in line for line in screen):
            break
        time.sleep(0.2)
    assert any("got:hello" in line for line in screen), screen
    job.kill(grace=1)
    assert (job.state, job.already_ended) == ("killed", False), job
    job.kill()
    assert job.already_ended
    with pytest.raises(BerthError) as e:
        job.send("more")
    assert "no stdin" in str(e.value)


def test_a_sandboxs_network_rules_change_while_it_runs(client):
    name = "sdk-net-" + uuid.uuid4().hex[:8]
    sb = Sandbox.create(name, "docker", network="allow:pypi.org", client=client)
    client.made.append(sb)
    assert sb.allow_host("*.github.com") == {"allow": ["pypi.org", "*.github.com"], "deny": []}
    assert sb.deny_host("pypi.org") == {"allow": ["*.github.com"], "deny": ["pypi.org"]}
    with pytest.raises(BerthError) as e:
        sb.allow_host("not a host")
    assert e.value.code.name == "INVALID_ARGUMENT", e.value
    # A sandbox made without rules has none to change.
    plain = _sandbox(client, "local")
    with pytest.raises(BerthError) as e:
        plain.allow_host("pypi.org")
    assert "has network off" in str(e.value), e.value


def test_a_bad_network_rule_fails_the_create(client):
    with pytest.raises(BerthError) as e:
        Sandbox.create("sdk-badnet", "docker", network="allow:bad host", client=client)
    assert e.value.code.name == "INVALID_ARGUMENT", e.value


def test_a_sandbox_is_taken_from_a_warm_pool(client):
    name = "sdkpool-" + uuid.uuid4().hex[:6]
    pool = client.create_pool(name, backend="docker", size=1, memory_mb=256)
    try:
        assert pool["ready"] == 1 and pool["backend"] == "docker", pool
        assert [p["name"] for p in client.pools()] == [name]
        sb = Sandbox.create("sdk-" + uuid.uuid4().hex[:8], from_pool=name, client=client)
        client.made.append(sb)
        assert sb.backend == "docker"
        assert sb.pool_member and sb.pool_member.startswith("pool-" + name + "-"), sb.pool_member
        assert sb.exec("echo warm").stdout == "warm\n"
        # Its settings are the pool's: other ones are refused, by name.
        from berth import _client as api
        req = api.pb.CreateSandbox(sandbox=api.pb.SandboxRef(name="sdk-x"), from_pool=name, memory_mb=512)
        with pytest.raises(BerthError) as e:
            api._call(client.sandboxes.Create, req)
        assert "memory" in str(e.value), e.value
    finally:
        client.remove_pool(name)
    assert client.pools() == []
