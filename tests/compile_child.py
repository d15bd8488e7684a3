"""Compile in a child process: the test process runs Triton's interpreter (``TRITON_INTERPRET=1``), under
which nothing is compiled for a GPU target."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from sagetriton_import import PACK_DIR


def compile_in_child(script: str, args=(), timeout: int = 900) -> dict:
    """Run ``script`` (it prints one JSON line last) with ``args`` in a child without the interpreter."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(PACK_DIR), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True,
                          cwd=str(PACK_DIR), timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def gluon_builds_in_child(script: str, args=(), timeout: int = 900) -> dict:
    """``compile_in_child`` for a script that reports ``"gluon": False`` when this Triton has no Gluon: the
    calling test is skipped then."""
    import pytest

    r = compile_in_child(script, args, timeout)
    if not r["gluon"]:
        pytest.skip("this Triton has no Gluon")
    return r
