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


def _setup(env: dict) -> str:
    r = subprocess.run(["bash", str(ROOT / ".ci" / "run"), "--setup-only"], env=env, capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_setup_installs_only_into_its_own_environment(tmp_path):
    # "python" and "python3" on PATH are this interpreter, logging each command line they run.
    real, calls, bin_dir = Path(sys.executable), tmp_path / "calls.log", tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("python", "python3"):
        (bin_dir / name).write_text(f'#!/bin/sh\necho "$*" >> "{calls}"\nexec "{real}" "$@"\n')
        (bin_dir / name).chmod(0o755)
    venv = tmp_path / "venv"
    # The calling Python's packages (read-only) and no index: the packages already here are found, nothing
    # is downloaded, and anything installed would have to land in the new environment. This interpreter
    # is usually a venv itself, whose base Python has no torch: the new one must see this one's packages.
    # No ComfyUI where the script looks (COMFYUI_PATH empty, another home): it says so first.
    home = tmp_path / "home"
    home.mkdir()
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", SAGETRITON_TEST_VENV=str(venv),
               SAGETRITON_TEST_VENV_SYSTEM_SITE="1", PIP_NO_INDEX="1", COMFYUI_PATH="", HOME=str(home))
    before = _freeze(real)
    out = _setup(env).splitlines()
    made = calls.read_text().splitlines()
    assert made[0] == f"-m venv --without-pip {venv}" and len(made) == 2 and made[1].startswith("-c "), made
    assert _freeze(real) == before
    found = subprocess.run([venv / "bin" / "python", "-c", "import torch, pytest, pytest_timeout, selenium, ruff, tqdm;"
                            " print(torch.__file__)"], check=True, capture_output=True, text=True).stdout
    assert Path(found.strip()).is_relative_to(Path(torch_dir()).parent), found
    assert out[0].startswith("creating the test environment") and out[1].startswith(
        "NOTE: no ComfyUI checkout found: the tests use ComfyUI 0.3.75 from PyPI"), out
    # A later run reuses the environment: the calling interpreter is not run at all.
    calls.unlink()
    _setup(env)
    assert not calls.exists()


def torch_dir() -> str:
    import torch

    return str(Path(torch.__file__).parent)
