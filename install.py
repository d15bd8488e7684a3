#!/usr/bin/env python
"""SageTriton installer: check the environment, build the kernels for this GPU, self-test, report.

    python install.py                          # what ComfyUI-Manager runs after installing requirements.txt
    python install.py --check-targets --json   # cross-compile for sm80..sm120, gfx1100, gfx1201, gfx942

The work is in ``installer/cli.py``; this file only imports the pack folder as a package (run as a
script, it is not importable by its own name).
"""
import importlib.util
import sys

from sagetriton_import import import_pack

if __name__ == "__main__":
    # The classic mistake is running this with a Python other than ComfyUI's: the pack's modules
    # import torch first, so say it here, in one sentence, before anything can fail on it.
    if importlib.util.find_spec("torch") is None:
        print(f"SageTriton install.py: this Python ({sys.executable}) has no torch; run install.py with the "
              "Python that starts ComfyUI (e.g. ComfyUI's venv/bin/python, or python_embeded\\python.exe "
              "on the Windows portable build).", file=sys.stderr)
        sys.exit(1)
    import_pack(run_init=False)  # the pack's __init__ registers ComfyUI nodes: not wanted here
    from sagetriton.installer.cli import main

    sys.exit(main())
