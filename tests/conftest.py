"""Test setup: the Triton interpreter for kernels on CPU, ComfyUI on CPU when one is found.

Order matters: TRITON_INTERPRET must be set before triton is imported, and ComfyUI's ``--cpu``
before ``comfy.model_management`` is imported (the pack imports it when ComfyUI is present).
"""
import os
import sys
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"
# A developer's own install.py report must not steer the tests: each session gets an empty folder.
if "SAGETRITON_REPORT_DIR" not in os.environ:
    import tempfile

    os.environ["SAGETRITON_REPORT_DIR"] = tempfile.mkdtemp(prefix="sagetriton-report-")
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the tests' helper modules
sys.path.append(str(Path(__file__).resolve().parent.parent))  # sagetriton_import (appended: the pack's folders
# must not shadow ComfyUI's own modules, such as its nodes.py)

import pytest  # noqa: E402

from sagetriton_import import find_comfyui, import_pack, prepare_comfyui_for_cpu  # noqa: E402

COMFYUI = find_comfyui()
if COMFYUI is not None:
    prepare_comfyui_for_cpu(COMFYUI)

PACK = import_pack()
# pytest imports the checkout's own __init__.py (the root is a package) under the folder's name, or
# as "__init__" when that name is not an identifier (ComfyUI-SageTriton, wt-nodes): without a parent
# package its relative imports fail. Hand pytest the pack we already imported.
_checkout = Path(PACK.__file__).parent.name
sys.modules.setdefault(_checkout if _checkout.isidentifier() else "__init__", PACK)

needs_comfyui = pytest.mark.skipif(
    COMFYUI is None, reason="ComfyUI not found (set COMFYUI_PATH, or clone it to ~/ComfyUI)")


def pytest_report_header(config):
    return f"SageTriton: ComfyUI at {COMFYUI or 'NOT FOUND (ComfyUI tests skipped)'}"


@pytest.fixture(scope="session")
def comfyui_path():
    if COMFYUI is None:
        pytest.skip("ComfyUI not found (set COMFYUI_PATH, or clone it to ~/ComfyUI)")
    return COMFYUI


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
