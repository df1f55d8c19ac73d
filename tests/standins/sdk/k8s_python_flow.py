"""The official Kubernetes Python client against berth's k8s stand-in.

Usage: KUBECONFIG=... python3 k8s_python_flow.py IMAGE

Creates a pod, waits for it to run, streams an exec (stdout, stderr and the
exit), and deletes the pod. Prints one line per step; exits non-zero on any
mismatch.
"""
import sys
import time

from kubernetes import client, config
from kubernetes.stream import stream


def main() -> None:
    image = sys.argv[1]
    config.load_kube_config()
    v1 = client.CoreV1Api()
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name="py-pod", labels={"made-by": "python"}),
        spec=client.V1PodSpec(
            restart_policy="Never",
            containers=[client.V1Container(name="main", image=image, command=["sleep", "infinity"])],
        ),
    )
    made = v1.create_namespaced_pod("default", pod)
    print("created", made.metadata.name, made.metadata.uid)
    deadline = time.time() + 60
    while True:
        p = v1.read_namespaced_pod("py-pod", "default")
        if p.status.phase == "Running":
            break
        if time.time() > deadline:
            sys.exit(f"py-pod is still {p.status.phase}")
        time.sleep(0.2)
    print("running on", p.spec.node_name, p.status.pod_ip)
    listed = v1.list_namespaced_pod("default", label_selector="made-by=python")
    print("listed", [i.metadata.name for i in listed.items])

    resp = stream(
        v1.connect_get_namespaced_pod_exec,
        "py-pod",
        "default",
        command=["sh", "-c", "echo out-$((6*7)); echo err-line >&2; exit 5"],
        stderr=True,
        stdin=False,
        stdout=True,
        tty=False,
        _preload_content=False,
    )
    out, err = "", ""
    while resp.is_open():
        resp.update(timeout=5)
        if resp.peek_stdout():
            out += resp.read_stdout()
        if resp.peek_stderr():
            err += resp.read_stderr()
    resp.close()
    print("exec stdout", repr(out))
    print("exec stderr", repr(err))
    print("exec code", resp.returncode)
    if out != "out-42\n" or err != "err-line\n" or resp.returncode != 5:
        sys.exit("the exec did not come back as it was run")

    v1.delete_namespaced_pod("py-pod", "default")
    try:
        v1.read_namespaced_pod("py-pod", "default")
        sys.exit("py-pod is still there after delete")
    except client.exceptions.ApiException as e:
        if e.status != 404:
            raise
    print("deleted")


if __name__ == "__main__":
    main()
