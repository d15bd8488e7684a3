"""The real engines that import ``sageattention`` by name, on the drop-in (``install.py
--provide-sageattention`` into a throwaway venv that sees this Python's packages read-only).

yunchang 0.6.4's LongContextAttention (Ulysses 2, ring 2 and 4, USP 2×2; 4 gloo ranks on the CPU) with
every SAGE attention type, diffusers 0.42.1's dispatcher (sage backend alone, context-parallel Ulysses
and ring, which hands K/V over as AsyncCollectiveTensors), xfuser 0.7.0's SAGE call and ComfyUI core's
``attention_sage`` (what ``--use-sage-attention`` runs): each against one-process attention on the full
sequence (``engine_children.py``). With SageAttention 2.2 itself, yunchang's causal steps would be
silently wrong (it ignores ``causal``) and ComfyUI's masks ignored; these tests would catch both.
"""
import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import venv_seeing_this_python
from sagetriton_import import PACK_DIR

CHILD = Path(__file__).resolve().parent / "engine_children.py"
MIN_COS = 0.999  # fp8 P·V at these tiny random shapes: 0.9994-0.9996; fp16 P·V: 0.99993-0.99997


@pytest.fixture(scope="module")
def dropin_python(tmp_path_factory):
    python = venv_seeing_this_python(tmp_path_factory.mktemp("engines") / "venv")
    proc = subprocess.run([str(python), str(PACK_DIR / "install.py"), "--provide-sageattention"],
                          capture_output=True, text=True, cwd=str(PACK_DIR), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return python


def needs(package: str) -> None:
    # Looked up, not imported: in this process the pack's folder is on sys.path, and its ``kernels``
    # would stand in for the Hugging Face package of that name which xfuser's imports reach.
    if importlib.util.find_spec(package) is None:
        pytest.skip(f"{package} is not installed (.ci/run installs it into the pinned leg)")


def run_child(python, *args) -> dict:
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([str(python), str(CHILD), *args], capture_output=True, text=True, timeout=900, env=env,
                          cwd=str(CHILD.parent))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-6000:]
    return json.loads(lines[-1][len("RESULT "):])


def test_yunchang_long_context_attention_with_every_sage_type(dropin_python):
    needs("yunchang")
    result = run_child(dropin_python, "yunchang")
    layouts = ("ulysses2", "ring2", "ring4", "usp2x2")
    types = ("SAGE_AUTO", "SAGE_FP16", "SAGE_FP16_TRITON", "SAGE_FP8", "SAGE_FP8_SM90")
    expected = {f"{lay} {t}{c}" for lay in layouts for t in types for c in ("", " causal")}
    assert set(result) == expected
    low = {k: c for k, c in result.items() if c < MIN_COS}
    assert not low, low


def test_diffusers_sage_backend_alone_and_context_parallel(dropin_python):
    needs("diffusers")
    result = run_child(dropin_python, "diffusers")
    assert set(result) == {"one process", "one process causal", "one process, lse", "lse max error", "ulysses",
                           "ring"}
    lse_error = result.pop("lse max error")
    assert lse_error < 0.05
    low = {k: c for k, c in result.items() if c < MIN_COS}
    assert not low, low


def test_xfuser_sage_attention_call(dropin_python):
    needs("xfuser")
    result = run_child(dropin_python, "xfuser")
    assert result["sage"] >= MIN_COS and result["sage causal"] >= MIN_COS, result
    assert result["lse max error"] < 0.05 and result["lse max error causal"] < 0.05, result


def test_comfyui_attention_sage_runs_the_drop_in(dropin_python, comfyui_path):
    """ComfyUI 0.3.64 in the pinned CI leg, 0.3.75 in the newest; masks applied (SageAttention 2.2 drops
    them), and no "Error running sage attention" fallback to SDPA."""
    result = run_child(dropin_python, "comfyui", str(comfyui_path))
    assert result.pop("errors logged") == []
    low = {k: c for k, c in result.items() if c < MIN_COS}
    assert not low and set(result) == {"plain", "mask", "skip_reshape"}, result
