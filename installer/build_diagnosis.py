"""What a kernel build error means on Windows (TinyCC, bundled with triton-windows) and the one line that
fixes it; ``install.py`` prints these under the variant table."""
from __future__ import annotations

import re
from typing import Optional

from .doctor import FAIL, TRITON_FOR_TORCH, Check, Environment, _embedded_python_fix, _major_minor

# Known texts of Triton build failures on Windows (TinyCC, bundled with triton-windows), most specific first.
# Each maps to a check name, what it means and one fix line.
_PYTHON_DEV_ERRORS = re.compile(
    r"include file '(Python|pyconfig)\.h' not found|Cannot open include file: '(Python|pyconfig)\.h'|"
    r"Failed to find Python libs|library 'python3\d*' not found|cannot find -lpython3", re.I)
_TINYCC_ERRORS = re.compile(r"\btcc(\.exe)?\b.*(error|returned non-zero)|tcc: error|undefined symbol '", re.I)
_TINYCC_LINKS_PYTHON = re.compile(r"\btcc(\.exe)?\b.*-lpython3\d*", re.I)


def classify_build_error(text: str, env: Optional[Environment] = None) -> Optional[Check]:
    """What a kernel build error means on Windows and the one line that fixes it; None when the text is
    not one of the known classes. ``env`` (when given) tells a missing include/libs apart from other
    TinyCC failures where the error text alone does not (triton-windows' message only names the command)."""
    env = env or Environment(system="Windows")
    if _PYTHON_DEV_ERRORS.search(text) or (_TINYCC_LINKS_PYTHON.search(text) and env.python_missing_dev):
        return Check("triton build", FAIL, "TinyCC could not compile or link Triton's launcher against Python: the "
                                           "Python running ComfyUI lacks its include or libs folder",
                     _embedded_python_fix(env))
    if _TINYCC_ERRORS.search(text):
        return Check("triton build", FAIL, "TinyCC (Triton's bundled C compiler on Windows) failed to build the "
                                           "launcher: " + _first_error_line(text),
                     "delete %USERPROFILE%\\.triton\\cache, then reinstall triton-windows: "
                     f"pip install --force-reinstall {_triton_windows_spec(env)}; with a non-ASCII user folder set "
                     "TRITON_CACHE_DIR and TEMP to an ASCII path")
    return None


def _triton_windows_spec(env: Environment) -> str:
    want = TRITON_FOR_TORCH.get(_major_minor(env.torch_version or ""))
    if want is None:
        return "\"triton-windows\" (the release line matching your torch)"
    return f"\"triton-windows>={want[0]}.{want[1]},<{want[0]}.{want[1] + 1}\""


def _first_error_line(text: str) -> str:
    for line in text.splitlines():
        if "error" in line.lower():
            return line.strip()[:200]
    return (text.strip().splitlines() or [""])[0][:200]


def explain_build_errors(texts, env: Optional[Environment] = None) -> list:
    """One check per distinct failure class among the build errors of a report (``install.py`` prints them
    under the variant table)."""
    seen, out = set(), []
    for text in texts:
        check = classify_build_error(text or "", env)
        if check is not None and check.fix not in seen:  # one line per class, not per failed variant
            seen.add(check.fix)
            out.append(check)
    return out
