"""Builds the package with its gRPC stubs generated and the protocol file
copied in (in a checkout, `berth/proto/berth/v1.proto` is a link to the
server's `service/proto/berth/v1.proto`, which a package cannot follow)."""

import importlib.util
import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO = os.path.realpath(os.path.join(HERE, "berth", "proto", "berth", "v1.proto"))


def _stubs():
    """berth/_stubs.py on its own (importing the package needs the stubs)."""
    spec = importlib.util.spec_from_file_location("_berth_stubs", os.path.join(HERE, "berth", "_stubs.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class BuildWithStubs(build_py):
    def run(self):
        super().run()
        root = os.path.join(self.build_lib, "berth", "proto")
        copied = os.path.join(root, "berth", "v1.proto")
        os.makedirs(os.path.dirname(copied), exist_ok=True)
        if os.path.lexists(copied):
            os.remove(copied)
        shutil.copy2(PROTO, copied)
        _stubs().generate(proto_root=root, out=self.build_lib)


setup(cmdclass={"build_py": BuildWithStubs})
