#!/usr/bin/env python
"""SageTriton installer: check the environment, build the kernels for this GPU, self-test, report.

    python install.py                          # what ComfyUI-Manager runs after installing requirements.txt
    python install.py --check-targets --json   # cross-compile for sm80..sm120, gfx1100, gfx1201, gfx942

The work is in ``installer/cli.py``; this file only imports the pack folder as a package (run as a
script, it is not importable by its own name).
"""
import sys

from sagetriton_import import import_pack

if __name__ == "__main__":
    import_pack(run_init=False)  # the pack's __init__ registers ComfyUI nodes: not wanted here
    from sagetriton.installer.cli import main

    sys.exit(main())
