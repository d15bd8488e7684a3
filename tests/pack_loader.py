"""Find the pack and ComfyUI without depending on folder names (shared by tests and bench/)."""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

PACK_DIR = Path(__file__).resolve().parent.parent
PACK_NAME = "sagetriton"  # the name tests import the pack under, whatever the checkout is called


def find_comfyui() -> Path | None:
    """COMFYUI_PATH, else the pack's usual home (ComfyUI/custom_nodes/<pack>), else ~/ComfyUI."""
    candidates = []
    if os.environ.get("COMFYUI_PATH"):
        candidates.append(Path(os.environ["COMFYUI_PATH"]))
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


def import_pack():
    """Import the checkout as the package ``sagetriton`` (idempotent)."""
    if PACK_NAME in sys.modules:
        return sys.modules[PACK_NAME]
    spec = importlib.util.spec_from_file_location(
        PACK_NAME, PACK_DIR / "__init__.py", submodule_search_locations=[str(PACK_DIR)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[PACK_NAME] = module
    spec.loader.exec_module(module)
    return module


if __name__ == "__main__":  # used by .ci/run: print the ComfyUI path, if any
    found = find_comfyui()
    if found:
        print(found)
