"""Small modules (house rules): every file in ``kernels/``, ``nodes/`` and ``installer/`` is at most 500 lines,
so each says what it holds; a file that grows past that is split along a real seam, not wrapped."""
import pytest

from sagetriton_import import PACK_DIR

MAX_LINES = 500


@pytest.mark.parametrize("floor", ["kernels", "nodes", "installer"])
def test_no_module_is_longer_than_500_lines(floor):
    files = sorted((PACK_DIR / floor).rglob("*.py"))
    assert files, f"no Python files under {floor}/"
    long = {str(p.relative_to(PACK_DIR)): n for p in files
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"over {MAX_LINES} lines (split along a seam): {long}"
