"""Builds the package with its gRPC stubs generated and the protocol file
copied in (in a checkout, `berth/proto/berth/v1.proto` is a link to the
server's `service/proto/berth/v1.proto`, which a package cannot follow)."""

import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO = os.path.realpath(os.path.join(HERE, "berth", "proto", "berth", "v1.proto"))


class BuildWithStubs(build_py):
    def run(self):
        super().run()
        from grpc_tools import protoc

        pkg = os.path.join(self.build_lib, "berth")
        root = os.path.join(pkg, "proto")
        os.makedirs(os.path.join(root, "berth"), exist_ok=True)
        copied = os.path.join(root, "berth", "v1.proto")
        if os.path.lexists(copied):
            os.remove(copied)
        shutil.copy2(PROTO, copied)
        include = os.path.join(os.path.dirname(protoc.__file__), "_proto")
        rc = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{root}",
                f"-I{include}",
                f"--python_out={self.build_lib}",
                f"--grpc_python_out={self.build_lib}",
                copied,
            ]
        )
        if rc != 0:
            raise RuntimeError(f"generating berth's stubs from {PROTO} failed (protoc exit {rc})")


setup(cmdclass={"build_py": BuildWithStubs})
