"""`.ci/run` installs only into its own virtual environment, never into the Python that runs it."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow  # creates a virtual environment and runs pip a few times


def _freeze(python) -> str:
    return subprocess.run([str(python), "-m", "pip", "freeze", "--all"], capture_output=True, text=True,
                          check=True).stdout


def _setup(env: dict) -> None:
    r = subprocess.run(["bash", str(ROOT / ".ci" / "run"), "--setup-only"], env=env, capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr


def test_setup_installs_only_into_its_own_environment(tmp_path):
    # "python" and "python3" on PATH are this interpreter, logging each command line they run.
    real, calls, bin_dir = Path(sys.executable), tmp_path / "calls.log", tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("python", "python3"):
        (bin_dir / name).write_text(f'#!/bin/sh\necho "$*" >> "{calls}"\nexec "{real}" "$@"\n')
        (bin_dir / name).chmod(0o755)
    venv = tmp_path / "venv"
    # System site packages (read-only) and no index: the packages already here are found, nothing is
    # downloaded, and anything installed would have to land in the new environment.
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", SAGETRITON_TEST_VENV=str(venv),
               SAGETRITON_TEST_VENV_SYSTEM_SITE="1", PIP_NO_INDEX="1")
    before = _freeze(real)
    _setup(env)
    assert calls.read_text().splitlines() == [f"-m venv --system-site-packages --without-pip {venv}"]
    assert _freeze(real) == before
    subprocess.run([venv / "bin" / "python", "-c", "import torch, pytest, pytest_timeout, selenium, ruff, tqdm"],
                   check=True)
    # A later run reuses the environment: the calling interpreter is not run at all.
    calls.unlink()
    _setup(env)
    assert not calls.exists()
