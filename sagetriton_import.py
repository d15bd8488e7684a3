"""The one way to import this checkout as the package ``sagetriton``, whatever its folder is called.

Used by install.py, the tests and bench/. ComfyUI imports the pack under its folder's name, which
need not be an identifier (``ComfyUI-SageTriton``); everything else imports it as ``sagetriton``.
Also finds a ComfyUI checkout for the tests and benchmarks (``python sagetriton_import.py`` prints it).
"""
from __future__ import annotations

import importlib.util
import os
import sys
import types
from pathlib import Path

PACK_DIR = Path(__file__).resolve().parent
PACK_NAME = "sagetriton"


def import_pack(run_init: bool = True, pack_dir: Path = PACK_DIR):
    """The pack at ``pack_dir`` as the package ``sagetriton`` (idempotent). ``run_init=False`` skips its
    ``__init__.py`` (which registers ComfyUI nodes): submodules still import (install.py)."""
    if PACK_NAME in sys.modules:
        return sys.modules[PACK_NAME]
    pack_dir = Path(pack_dir).resolve()
    if not run_init:
        module = types.ModuleType(PACK_NAME)
        module.__path__ = [str(pack_dir)]
        module.__file__ = str(pack_dir / "__init__.py")
        sys.modules[PACK_NAME] = module
        return module
    spec = importlib.util.spec_from_file_location(PACK_NAME, pack_dir / "__init__.py",
                                                  submodule_search_locations=[str(pack_dir)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[PACK_NAME] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[PACK_NAME]
        raise
    return module


def find_comfyui() -> Path | None:
    """COMFYUI_PATH, else the pack's usual home (ComfyUI/custom_nodes/<pack>), else ~/ComfyUI."""
    candidates = [Path(os.environ["COMFYUI_PATH"])] if os.environ.get("COMFYUI_PATH") else []
    candidates += [PACK_DIR.parent.parent, Path.home() / "ComfyUI"]
    for c in candidates:
        if (c / "comfy" / "model_patcher.py").is_file() and (c / "main.py").is_file():
            return c.resolve()
    return None


def prepare_comfyui_for_cpu(path: Path) -> None:
    """Put ComfyUI on sys.path and force its CPU mode before model_management is imported."""
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
    import comfy.cli_args

    comfy.cli_args.args.cpu = True


if __name__ == "__main__":  # used by .ci/run: print the ComfyUI path, if any
    found = find_comfyui()
    if found:
        print(found)
