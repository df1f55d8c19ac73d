"""The gRPC stubs of berth's typed API, generated from its one protocol file.

`berth/proto/berth/v1.proto` is the server's own `service/proto/berth/v1.proto`
(a link in a checkout, a copy in a built package). The stubs are generated
with grpcio-tools next to this file the first time they are needed, and again
whenever the protocol file is newer than they are, so a checkout never runs
stubs of another version of the protocol.
"""

import importlib
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_PROTO_ROOT = os.path.join(_HERE, "proto")
_PROTO = os.path.join(_PROTO_ROOT, "berth", "v1.proto")
_OUT = os.path.dirname(_HERE)
_GENERATED = [os.path.join(_HERE, n) for n in ("v1_pb2.py", "v1_pb2_grpc.py")]


def _stale():
    try:
        made = min(os.path.getmtime(p) for p in _GENERATED)
    except OSError:
        return True
    try:
        return os.path.getmtime(_PROTO) > made
    except OSError:
        # A built package without the proto file: its stubs are what it has.
        return False


def generate(proto_root=_PROTO_ROOT, out=_OUT):
    """Generate the stubs from `proto_root`/berth/v1.proto as the package
    `berth` under `out` (needs grpcio-tools). setup.py calls it too."""
    proto = os.path.join(proto_root, "berth", "v1.proto")
    try:
        from grpc_tools import protoc
    except ImportError as e:
        raise ImportError(
            "berth's gRPC stubs are not generated yet and grpcio-tools is missing: "
            "pip install grpcio grpcio-tools"
        ) from e
    include = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    rc = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{proto_root}",
            f"-I{include}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            proto,
        ]
    )
    if rc != 0:
        raise RuntimeError(f"generating berth's stubs from {proto} failed (protoc exit {rc})")


def load():
    """The generated modules (`v1_pb2`, `v1_pb2_grpc`), generated first if needed."""
    if _stale():
        generate()
        for name in ("berth.v1_pb2", "berth.v1_pb2_grpc"):
            sys.modules.pop(name, None)
    pb2 = importlib.import_module("berth.v1_pb2")
    grpc_mod = importlib.import_module("berth.v1_pb2_grpc")
    return pb2, grpc_mod


if __name__ == "__main__":
    generate()
