"""Windows portable's embedded Python: its ``._pth`` file keeps the script's folder off sys.path.
``python -I`` (isolated mode) gives the same condition on any machine, so install.py and the pack are run
that way here, from a folder other than the pack's, in a child process."""
import json
import os
import subprocess
import sys

from sagetriton_import import PACK_DIR


def _isolated(args, cwd, timeout=300):
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "PYTHONPATH")}
    return subprocess.run([sys.executable, "-I", *args], cwd=str(cwd), capture_output=True, text=True, env=env,
                          timeout=timeout)


def test_install_py_runs_without_its_folder_on_sys_path(tmp_path):
    probe = _isolated(["-c", "import sagetriton_import"], tmp_path)
    assert "No module named 'sagetriton_import'" in probe.stderr  # the condition really holds
    proc = _isolated([str(PACK_DIR / "install.py"), "--check-targets", "sm80", "--json"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    result = json.loads(proc.stdout)["sm80"]
    assert result["ok"], result


def test_pack_loads_by_path_without_its_folder_on_sys_path(tmp_path, comfyui_path):
    # As ComfyUI loads a custom node: by file path, under the folder's name (not an identifier).
    code = (
        "import importlib.util, sys\n"
        "comfy, pack = sys.argv[1], sys.argv[2]\n"
        "sys.path.insert(0, comfy)\n"
        "import comfy.cli_args; comfy.cli_args.args.cpu = True\n"
        "spec = importlib.util.spec_from_file_location('ComfyUI-SageTriton', pack + '/__init__.py',\n"
        "                                              submodule_search_locations=[pack])\n"
        "m = importlib.util.module_from_spec(spec); sys.modules[spec.name] = m; spec.loader.exec_module(m)\n"
        "print(sorted(m.NODE_CLASS_MAPPINGS))\n"
    )
    proc = _isolated(["-c", code, str(comfyui_path), str(PACK_DIR)], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "SageTritonPatchModelAttention" in proc.stdout and "SageTritonSettings" in proc.stdout, proc.stdout
