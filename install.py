#!/usr/bin/env python
"""SageTriton installer: check the environment, build the kernels for this GPU, self-test, report.

    python install.py                          # what ComfyUI-Manager runs after installing requirements.txt
    python install.py --check-targets --json   # cross-compile for sm80..sm120, gfx1100, gfx1201, gfx942

The work is in ``installer/cli.py``; this file only imports the pack folder as a package (run as a
script, it is not importable by its own name).
"""
import importlib.util
import os
import sys


def _load_sagetriton_import():
    """sagetriton_import.py from this script's folder, by file path. Windows portable's embedded Python
    (its ``._pth`` file) and ``python -I`` leave the script's folder off sys.path, so a plain import
    fails there; loading by path also leaves sys.path as the user has it."""
    if "sagetriton_import" in sys.modules:
        return sys.modules["sagetriton_import"]
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sagetriton_import.py")
    spec = importlib.util.spec_from_file_location("sagetriton_import", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["sagetriton_import"] = module
    spec.loader.exec_module(module)
    return module


if __name__ == "__main__":
    # The classic mistake is running this with a Python other than ComfyUI's: the pack's modules
    # import torch first, so say it here, in one sentence, before anything can fail on it.
    if importlib.util.find_spec("torch") is None:
        print(f"SageTriton install.py: this Python ({sys.executable}) has no torch; run install.py with the "
              "Python that starts ComfyUI (e.g. ComfyUI's venv/bin/python, or python_embeded\\python.exe "
              "on the Windows portable build).", file=sys.stderr)
        sys.exit(1)
    # The pack's __init__ registers ComfyUI nodes: not wanted here.
    _load_sagetriton_import().import_pack(run_init=False)
    from sagetriton.installer.cli import main

    sys.exit(main())
