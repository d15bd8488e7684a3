"""The pack's shape: ``__init__.py`` -> ``nodes/`` -> ``installer/`` -> ``kernels/``, arrows only downwards.

``kernels/`` is the library alone (no installer, no nodes, no ComfyUI, no processes); ``installer/``
builds and checks it and never reaches up into the nodes. Read from the sources with ``ast``, so a
lazy import inside a function counts as much as one at the top.
"""
import ast

import pytest

from sagetriton_import import PACK_DIR

FLOORS = ("nodes", "installer", "kernels")  # top to bottom; the root __init__.py stands above them
COMFYUI_MODULES = {"comfy", "comfy_api", "comfy_execution", "folder_paths", "server", "nodes", "aiohttp"}


def _imports(path):
    """(floor or None, absolute top-level module or None) for every import in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = path.parent.relative_to(PACK_DIR).parts
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[:len(package) - (node.level - 1)] if node.level > 1 else package
            target = (*base, *(node.module.split(".") if node.module else ()))
            names = [target] if node.module else [(*base, a.name) for a in node.names]
            for t in names:
                yield (t[0] if t else None), None
        elif isinstance(node, ast.ImportFrom):
            yield None, node.module.split(".")[0]
        elif isinstance(node, ast.Import):
            for a in node.names:
                yield None, a.name.split(".")[0]


def _floor_files(floor):
    return sorted((PACK_DIR / floor).glob("*.py"))


@pytest.mark.parametrize("floor", FLOORS)
def test_no_arrow_points_up(floor):
    above = set(FLOORS[:FLOORS.index(floor)])
    for path in _floor_files(floor):
        for target, _ in _imports(path):
            assert target is None or target in FLOORS, f"{path.name} imports the pack root ({target})"
            assert target not in above, f"{floor}/{path.name} imports {target}/"


def test_the_kernel_library_stands_alone():
    for path in _floor_files("kernels"):
        modules = {m for _, m in _imports(path) if m}
        assert not modules & COMFYUI_MODULES, f"kernels/{path.name} imports ComfyUI: {modules & COMFYUI_MODULES}"
        assert not modules & {"subprocess", "multiprocessing"}, f"kernels/{path.name} starts processes"


def test_the_root_imports_the_nodes_only():
    targets = {t for t, _ in _imports(PACK_DIR / "__init__.py") if t}
    assert targets == {"nodes"}, targets


def test_install_py_is_a_thin_command_line():
    text = (PACK_DIR / "install.py").read_text(encoding="utf-8")
    assert len(text.splitlines()) < 80
    assert "sagetriton.installer.cli" in text
