"""The installer measures and writes, the runtime reads: ``nodes/`` imports ``installer/`` in one module only
(``nodes/config/install_report.py``), lazy imports included, so what the runtime takes from the installer is in
one place."""
import ast

from sagetriton_import import PACK_DIR

ONE_PLACE = "nodes/config/install_report.py"


def _imports_installer(path) -> list:
    package = path.parent.relative_to(PACK_DIR).parts
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[:len(package) - (node.level - 1)]
            target = (*base, *(node.module.split(".") if node.module else ()))
            names = [target] if node.module else [(*base, a.name) for a in node.names]
            found += [node.lineno for t in names if t[:1] == ("installer",)]
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [node.module] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            found += [node.lineno for m in modules if m and ".installer" in f".{m}"]
    return found


def test_the_nodes_import_the_installer_in_one_module():
    importing = {str(p.relative_to(PACK_DIR)): lines for p in sorted((PACK_DIR / "nodes").rglob("*.py"))
                 if (lines := _imports_installer(p))}
    assert set(importing) == {ONE_PLACE}, importing
