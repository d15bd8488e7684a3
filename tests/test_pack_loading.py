"""The pack as ComfyUI loads it, and as a plain library without ComfyUI."""
import asyncio
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import needs_comfyui, venv_seeing_this_python
from sagetriton_import import PACK_DIR


def test_imports_without_comfyui_as_a_kernel_library():
    """No ComfyUI on the path: no nodes, but the kernels and the counters are there, and importing
    does no heavy work (no Triton compilation, no CUDA initialisation)."""
    code = textwrap.dedent(f"""
        import importlib.util, sys
        spec = importlib.util.spec_from_file_location(
            "pack", {str(PACK_DIR / "__init__.py")!r}, submodule_search_locations=[{str(PACK_DIR)!r}])
        pack = importlib.util.module_from_spec(spec)
        sys.modules["pack"] = pack
        spec.loader.exec_module(pack)
        assert "comfy" not in sys.modules
        # Cheap: neither torch nor triton yet (pytest imports a checkout folder named like a package,
        # e.g. "main", before tests/conftest.py can select the Triton interpreter).
        assert "triton" not in sys.modules and "torch" not in sys.modules, "import pulled in torch/triton"
        assert pack.NODE_CLASS_MAPPINGS == {{}} and pack.WEB_DIRECTORY == "./web"
        stats = pack.attention_stats()
        assert stats == {{"kernel": 0, "fallback": {{}}, "sparse": 0}}, stats
        from pack.kernels import sageattn
        import torch
        assert not torch.cuda.is_initialized()
        print("ok")
    """)
    # Every folder that holds ComfyUI's ``comfy`` package leaves the path, whatever it is called.
    env_path = [p for p in sys.path if not (Path(p or ".") / "comfy" / "model_patcher.py").is_file()]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={"PYTHONPATH": ":".join(env_path), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]


@needs_comfyui
def test_comfyui_loads_the_pack_with_its_own_loader(comfyui_path):
    import nodes  # ComfyUI's nodes.py

    assert asyncio.run(nodes.load_custom_node(str(PACK_DIR))) is True
    for node_id, name in (("SageTritonPatchModelAttention", "Patch Model Attention"),
                          ("SageTritonSettings", "Sage Settings")):
        assert node_id in nodes.NODE_CLASS_MAPPINGS
        assert nodes.NODE_DISPLAY_NAME_MAPPINGS[node_id] == name
    web_dirs = [v for v in nodes.EXTENSION_WEB_DIRS.values() if (PACK_DIR / "web").samefile(v)]
    assert web_dirs, f"WEB_DIRECTORY not registered: {nodes.EXTENSION_WEB_DIRS}"


def test_a_test_session_removes_its_report_folder(tmp_path):
    """conftest.py gives each session an empty SAGETRITON_REPORT_DIR in the temp folder: gone afterwards."""
    env = {k: v for k, v in os.environ.items() if k != "SAGETRITON_REPORT_DIR"}
    env["TMPDIR"] = str(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "tests/test_node_definitions.py::test_registry_ids_and_display_names"],
                          cwd=str(PACK_DIR), env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert not list(tmp_path.glob("sagetriton-report-*")), list(tmp_path.iterdir())


@pytest.mark.slow  # a virtual environment and a pip install
def test_pip_install_editable_makes_the_library_importable_as_sagetriton(tmp_path):
    """The README's library snippet, from a clone after ``pip install -e .`` (in a throwaway venv that
    sees this Python's torch and setuptools, never the machine's base Python; no download: no build
    isolation, no dependencies)."""
    python = str(venv_seeing_this_python(tmp_path / "venv"))
    pip = subprocess.run([python, "-m", "pip", "install", "-q", "-e", str(PACK_DIR), "--no-build-isolation",
                          "--no-deps"], capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, pip.stderr[-2000:]
    code = "from sagetriton.kernels import sageattn; import sagetriton; print(sagetriton.__file__)"
    out = subprocess.run([python, "-c", code], cwd=str(tmp_path), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and Path(out.stdout.strip()) == PACK_DIR / "__init__.py", out.stderr[-2000:]


def test_a_run_without_comfyui_says_so_before_the_first_test(tmp_path):
    """README's test command, -q included: no ComfyUI found means a line at the start naming the fix."""
    if (PACK_DIR.parent.parent / "comfy" / "model_patcher.py").is_file():
        pytest.skip("this clone lives in ComfyUI/custom_nodes: ComfyUI is always found")
    env = dict(os.environ, COMFYUI_PATH="", HOME=str(tmp_path))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "tests/test_node_definitions.py::test_registry_ids_and_display_names"],
                          cwd=str(PACK_DIR), env=env, capture_output=True, text=True, timeout=300)
    first = proc.stdout.splitlines()[0]
    assert first.startswith("SageTriton: ComfyUI NOT FOUND") and "Fix: COMFYUI_PATH=" in first, proc.stdout[-2000:]
