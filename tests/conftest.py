"""Test setup: the Triton interpreter for kernels on CPU, ComfyUI on CPU when one is found.

Order matters: TRITON_INTERPRET must be set before triton is imported, and ComfyUI's ``--cpu``
before ``comfy.model_management`` is imported (the pack imports it when ComfyUI is present).
"""
import os
import sys
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"
# A developer's own install.py report must not steer the tests: each session gets an empty folder.
_OWN_REPORT_DIR = None  # removed when the session ends (pytest_unconfigure)
if "SAGETRITON_REPORT_DIR" not in os.environ:
    import tempfile

    _OWN_REPORT_DIR = os.environ["SAGETRITON_REPORT_DIR"] = tempfile.mkdtemp(prefix="sagetriton-report-")
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the tests' helper modules
sys.path.append(str(Path(__file__).resolve().parent.parent))  # sagetriton_import (appended: the pack's folders
# must not shadow ComfyUI's own modules, such as its nodes.py)

import pytest  # noqa: E402

from sagetriton_import import PACK_DIR, find_comfyui, import_pack, prepare_comfyui_for_cpu  # noqa: E402

COMFYUI = find_comfyui()
if COMFYUI is not None:
    prepare_comfyui_for_cpu(COMFYUI)

PACK = import_pack()
needs_comfyui = pytest.mark.skipif(
    COMFYUI is None, reason="ComfyUI not found (set COMFYUI_PATH, or clone it to ~/ComfyUI)")


# Test groups (``-m``): unit (no ComfyUI: kernels through the Triton interpreter, dispatch, installer),
# comfyui (ComfyUI imported in this process), server (a ComfyUI server started; with browser, Chromium
# drives its frontend), gpu (a real GPU, skipped without one), slow (child processes that compile for
# every target). The fast part alone: ``pytest -m "unit and not slow"``.
GROUPS = ("unit", "comfyui", "server", "browser", "gpu", "slow")


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects
def pytest_collection_modifyitems(config, items):
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if fixtures & {"check_targets_json", "gluon_ptx"}:  # cross-compiled in a child process
            item.add_marker("slow")
        if "sage_server" in fixtures and not item.get_closest_marker("server"):
            item.add_marker("server")
        if "comfyui_path" in fixtures or item.get_closest_marker("server"):
            item.add_marker("comfyui")
        if not any(item.get_closest_marker(m) for m in ("comfyui", "gpu")):
            item.add_marker("unit")


NO_COMFYUI_FIX = ("ComfyUI NOT FOUND: the ComfyUI, server and browser tests will be skipped. Fix: "
                  "COMFYUI_PATH=/path/to/ComfyUI python -m pytest (also found: this clone in "
                  "ComfyUI/custom_nodes/, or ~/ComfyUI)")


def pytest_report_header(config):
    return f"SageTriton: ComfyUI at {COMFYUI}" if COMFYUI else f"SageTriton: {NO_COMFYUI_FIX}"


def pytest_sessionstart(session):
    # Before any test runs, also under -q (which hides the header): not 20 minutes later in the skips.
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if COMFYUI is None and reporter is not None and session.config.get_verbosity() < 0:
        reporter.write_line(f"SageTriton: {NO_COMFYUI_FIX}", yellow=True, bold=True)


def venv_seeing_this_python(path: Path) -> Path:
    """A throwaway venv that sees this interpreter's packages read-only; its Python's path.

    Not ``--system-site-packages``: when this interpreter is itself a venv (the test venv), that would
    show the machine's base Python instead (no torch, an old setuptools, no wheel)."""
    import site
    import subprocess

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    python = path / "bin" / "python"
    own = subprocess.run([str(python), "-c", "import site; print(site.getsitepackages()[0])"], check=True,
                         capture_output=True, text=True).stdout.strip()
    line = "import site; " + "; ".join(f"site.addsitedir({p!r})" for p in site.getsitepackages())
    (Path(own) / "_this_python.pth").write_text(line + "\n")
    return python


@pytest.fixture(scope="session")
def comfyui_path():
    if COMFYUI is None:
        pytest.skip("ComfyUI not found (set COMFYUI_PATH, or clone it to ~/ComfyUI)")
    return COMFYUI


@pytest.fixture(scope="module")
def bench_script():
    """``bench_script("gpu_check")``: a bench/ script imported as a module (bench/ on sys.path meanwhile, for the
    script's own imports of its neighbours)."""
    import importlib

    folder = str(PACK_DIR / "bench")
    sys.path.insert(0, folder)
    try:
        yield importlib.import_module
    finally:
        sys.path.remove(folder)


@pytest.fixture(scope="session")
def pack():
    return PACK


@pytest.fixture
def seed(request):
    """A fresh seed per test, printed so a failure can be replayed (SAGE_TEST_SEED=N)."""
    import random

    import torch

    s = int(os.environ.get("SAGE_TEST_SEED", random.randrange(2**31)))
    print(f"seed={s} ({request.node.name})")
    torch.manual_seed(s)
    return s


def pytest_unconfigure(config):
    if _OWN_REPORT_DIR:
        import shutil

        shutil.rmtree(_OWN_REPORT_DIR, ignore_errors=True)


@pytest.fixture
def rep(pack, tmp_path, monkeypatch):
    """``installer.report`` on an empty report folder of the test's own."""
    monkeypatch.setenv("SAGETRITON_REPORT_DIR", str(tmp_path))
    from sagetriton.installer import report

    report.invalidate_cache()
    yield report
    report.invalidate_cache()


@pytest.fixture
def no_install_report(monkeypatch, tmp_path, pack):
    """Hermetic: no self-test report from this checkout's earlier runs (an empty report folder)."""
    monkeypatch.setenv("SAGETRITON_REPORT_DIR", str(tmp_path / "report"))
    pack.installer.report.invalidate_cache()
    yield
    pack.installer.report.invalidate_cache()


@pytest.fixture(scope="module")
def tiny():
    """The tiny random-weight models by name (``tiny_models.BUILDERS``), built once per test module."""
    from tiny_models import BUILDERS

    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = BUILDERS[name](seed=0)
        return cache[name]

    return get
