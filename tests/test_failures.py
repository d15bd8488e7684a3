"""What failed in this process lives in one object (``kernels/failures.py``) with one reset: no module keeps
failure state of its own, none reaches into another's, and the one reset forgets everything."""
import ast
from types import SimpleNamespace

from sagetriton.kernels import failures, hopper_host, launcher, replay
from sagetriton.nodes.routing import dispatch

from sagetriton_import import PACK_DIR

# The module globals that held this state before it had one place.
OLD_STATE = {"_disabled_variants", "_proven_variants", "_failed", "_shared_kv_error", "_shared_kv_lse_error",
             "_disabled", "_recordings", "_refused"}


def _sources():
    for floor in ("kernels", "nodes", "installer"):
        for path in sorted((PACK_DIR / floor).rglob("*.py")):
            if path.name != "failures.py" or path.parent.name != "kernels":
                yield path, ast.parse(path.read_text(encoding="utf-8"))


def test_no_module_keeps_failure_state_of_its_own():
    found = []
    for path, tree in _sources():
        for node in tree.body:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
                if isinstance(node, ast.AnnAssign) else []
            found += [f"{path.relative_to(PACK_DIR)}: {t.id}" for t in targets
                      if isinstance(t, ast.Name) and t.id in OLD_STATE]
        found += [f"{path.relative_to(PACK_DIR)}:{n.lineno}: {ast.unparse(n)}" for n in ast.walk(tree)
                  if isinstance(n, ast.Attribute) and n.attr in OLD_STATE]  # a reach-in to another module's
    assert not found, found


def test_one_reset_forgets_every_failure(monkeypatch):
    memory = failures.memory
    monkeypatch.setattr(dispatch.logger, "warning", lambda *a, **k: None)
    def kernel():  # a stand-in for a compiled kernel (hashable, with a name)
        pass

    launcher.disable(kernel, RuntimeError("launcher takes other arguments"))
    plan = SimpleNamespace(config="a config", arch=SimpleNamespace(arch="sm90"))
    dispatch.disable_variant(("a variant",), plan, RuntimeError("does not compile"))
    memory.proven_variants.add(("another variant",))
    memory.gluon, memory.gluon_lse, memory.gluon_kcols, memory.rope = "no Gluon", "no Gluon LSE", "no K cols", "no RoPE"
    memory.replays[("a key",)] = object()
    memory.refused_replays[("a big key",)] = None
    # Each owner reads its state from the memory.
    assert launcher.disabled(kernel) == "RuntimeError: launcher takes other arguments"
    assert dispatch.disabled_variants() == {("a variant",): "RuntimeError: does not compile"}
    assert hopper_host.errors() == ("no Gluon", "no Gluon LSE", "no K cols")
    assert hopper_host.shared_kv_error() == "no Gluon"
    assert replay.refused(("a big key",))

    failures.reset()
    assert launcher.disabled(kernel) is None and dispatch.disabled_variants() == {}
    assert hopper_host.errors() == (None, None, None) and memory.rope is None
    assert not memory.proven_variants and not memory.replays and not replay.refused(("a big key",))
