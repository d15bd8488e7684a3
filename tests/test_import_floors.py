"""The pack's shape: ``__init__.py`` -> ``nodes/`` -> ``installer/`` -> ``kernels/``, arrows only downwards.

``kernels/`` is the library alone (no installer, no nodes, no ComfyUI, no processes); ``installer/``
builds and checks it and never reaches up into the nodes. Read from the sources with ``ast``, so a
lazy import inside a function counts as much as one at the top. Inside ``nodes/`` no two modules import
each other at module level, and its subpackages (``ui/``, ``routing/``, ...) import one way, lazy imports
included; pyproject.toml lists every package folder, so a wheel holds them all.
"""
import ast
import re

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
    return sorted((PACK_DIR / floor).rglob("*.py"))


def _module_of(path):
    parts = path.relative_to(PACK_DIR).with_suffix("").parts
    return parts[:-1] if parts[-1] == "__init__" else parts


def _is_module(parts):
    where = PACK_DIR.joinpath(*parts)
    return where.with_suffix(".py").is_file() or (where / "__init__.py").is_file()


def _pack_imports(path, module_level_only):
    """The pack modules ``path`` imports (tuples of names below the pack root), relative imports only (the pack
    imports itself that way). Module level: top-level statements, inside a top-level ``if``/``try``/``with``
    too; ``if TYPE_CHECKING:`` blocks never run, so they are left out either way."""
    package = path.parent.relative_to(PACK_DIR).parts

    def walk(statements):
        for s in statements:
            if isinstance(s, ast.If) and "TYPE_CHECKING" in ast.unparse(s.test):
                continue
            if isinstance(s, ast.ImportFrom) and s.level:
                base = package[:len(package) - (s.level - 1)]
                target = (*base, *(s.module.split(".") if s.module else ()))
                submodules = [(*target, a.name) for a in s.names if _is_module((*target, a.name))]
                yield from submodules or [target]
            elif isinstance(s, (ast.If, ast.Try, ast.With)) or (not module_level_only and hasattr(s, "body")):
                for field in ("body", "orelse", "finalbody"):
                    yield from walk(getattr(s, field, None) or [])
                for handler in getattr(s, "handlers", None) or []:
                    yield from walk(handler.body)

    yield from walk(ast.parse(path.read_text(encoding="utf-8")).body)


def _cycles(graph):
    """Every cycle a depth-first search meets (empty when ``graph`` is acyclic), each as a list of nodes."""
    state, stack, found = {}, [], []

    def visit(u):
        state[u] = "open"
        stack.append(u)
        for v in sorted(graph.get(u, ())):
            if state.get(v) == "open":
                found.append([*stack[stack.index(v):], v])
            elif v not in state:
                visit(v)
        stack.pop()
        state[u] = "done"

    for u in sorted(graph):
        if u not in state:
            visit(u)
    return found


def _nodes_graph(module_level_only):
    graph = {}
    for path in _floor_files("nodes"):
        module = _module_of(path)
        graph[module] = {t for t in _pack_imports(path, module_level_only) if t[:1] == ("nodes",) and t != module}
    return graph


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


def test_no_import_cycle_between_nodes_modules():
    """Module-level imports inside ``nodes/`` form no cycle (a cycle makes import order matter, and breaks)."""
    cycles = _cycles(_nodes_graph(module_level_only=True))
    assert not cycles, ["  ->  ".join(".".join(m) for m in c) for c in cycles]


def test_nodes_subpackages_import_one_way():
    """Between ``nodes/``'s subpackages (and its top-level modules) imports run one way, lazy ones included."""
    def group(module):  # nodes/<sub>/x.py -> "<sub>"; nodes/x.py -> "x"; nodes/__init__.py -> None
        return module[1] if len(module) > 1 else None

    packages = {}
    for module, targets in _nodes_graph(module_level_only=False).items():
        for target in targets:
            if None not in (group(module), group(target)) and group(module) != group(target):
                packages.setdefault(group(module), set()).add(group(target))
    cycles = _cycles(packages)
    assert not cycles, ["  ->  ".join(c) for c in cycles]


def test_every_package_folder_is_in_the_wheel():
    """pyproject.toml lists packages by hand: a new subpackage missing there would be missing from the wheel."""
    text = (PACK_DIR / "pyproject.toml").read_text(encoding="utf-8")
    listed = set(re.findall(r'"(sagetriton(?:\.\w+)*)"', re.search(r"^packages = \[(.*?)\]", text, re.S | re.M)[1]))
    folders = {".".join(("sagetriton", *p.parent.relative_to(PACK_DIR).parts))
               for floor in FLOORS for p in (PACK_DIR / floor).rglob("__init__.py")}
    assert folders <= listed, sorted(folders - listed)


def test_the_root_imports_the_nodes_only():
    targets = {t for t, _ in _imports(PACK_DIR / "__init__.py") if t}
    assert targets == {"nodes"}, targets


def test_install_py_is_a_thin_command_line():
    text = (PACK_DIR / "install.py").read_text(encoding="utf-8")
    assert len(text.splitlines()) < 80
    assert "sagetriton.installer.cli" in text
