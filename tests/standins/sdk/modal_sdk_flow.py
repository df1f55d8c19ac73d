"""The official Modal SDK, unchanged, against whatever MODAL_SERVER_URL names.

Looks up (creates) an app, creates a sandbox from an image, runs a command in
it, reads its output and exit code, terminates the sandbox, and prints what it
saw as one JSON line. The berth test suite runs it against the Modal stand-in.
"""

import json
import sys

import modal

app = modal.App.lookup("berth-sdk-check", create_if_missing=True)
image = modal.Image.from_registry("debian:bookworm-slim")
sb = modal.Sandbox.create("sleep", "infinity", app=app, image=image, timeout=300)
p = sb.exec("bash", "-c", "echo hello from the sdk; echo to-stderr >&2; exit 7")
stdout = p.stdout.read()
stderr = p.stderr.read()
code = p.wait()
sb.terminate()
sb.wait(raise_on_termination=False)
print(
    json.dumps(
        {
            "app_id": app.app_id,
            "sandbox_id": sb.object_id,
            "stdout": stdout,
            "stderr": stderr,
            "exit_code": code,
            "returncode": p.returncode,
            "sandbox_returncode": sb.returncode,
        }
    )
)
sys.stdout.flush()
