"""Why a kernel could not be built, in one readable line: ``root_cause``, used wherever such an error
is logged or reported (the runtime's fallback log lines, install.py's self-test and report,
``--check-targets``). Imports no Triton: the nodes use it at load time."""
from __future__ import annotations

import re
from typing import Optional

_CARET = re.compile(r"^\s*\^+\s*$")
_DIAGNOSTIC = re.compile(r"\b(error|fatal)\s*:", re.I)
_REPR = re.compile(r"^(\w+(?:\.\w+)*)\((['\"])(.*)\2,?\)$", re.S)
MAX_CAUSE = 300


def is_oom(e: BaseException) -> bool:
    """Out of GPU memory (another program, or ComfyUI sampling next to the first-start self-test): says nothing
    about the kernel, so nothing is turned off for it."""
    return type(e).__name__ == "OutOfMemoryError" or "out of memory" in str(e).lower()


def root_cause(e: BaseException) -> str:
    """The innermost reason in ``e``'s chain (``__cause__``, else ``__context__``), as ``Type: message``
    in one line of at most ``MAX_CAUSE`` characters.

    A Triton ``CompilationError`` prints the kernel's source up to the failing line, then a caret line,
    then (only on the innermost error of a chain of nested calls) the message: its text's first line is
    ``at 10:4: def kernel(...`` and its last often the caret. The message is taken from its
    ``error_message`` instead (the ``repr`` of the real error: unwrapped), with the Triton function and
    line it happened in."""
    chain = []
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        chain.append(e)
        e = e.__cause__ or (None if e.__suppress_context__ else e.__context__)
    for exc in reversed(chain):
        line = _one_line(exc)
        if line:
            return line[:MAX_CAUSE]
    return type(chain[0]).__name__ if chain else ""


def _one_line(exc: BaseException) -> Optional[str]:
    if hasattr(exc, "error_message") and hasattr(exc, "src"):  # triton.compiler.errors.CompilationError
        msg = exc.error_message
        if not msg:
            return None  # an outer frame of a nested call: the reason is further in
        text = " ".join(str(msg).split())
        m = _REPR.match(text)
        kind, text = (m.group(1), m.group(3)) if m else (type(exc).__name__, text)
        return f"{kind}: {text}{_where(exc)}"
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip() and not _CARET.match(ln)]
    if not lines:
        return None
    # A tool's output (ptxas, MLIR passes) quoted in the message: its own diagnostic is the reason.
    diagnostics = [ln for ln in lines[1:] if _DIAGNOSTIC.search(ln)]
    text = diagnostics[-1] if diagnostics else lines[0]
    return f"{type(exc).__name__}: {' '.join(text.split())}"


def _where(exc) -> str:
    """`` (in fn, line N)`` of a CompilationError, N counted in the function's own source."""
    name = re.search(r"def\s+(\w+)", exc.src or "")
    line = getattr(exc.node, "lineno", None)
    if not name:
        return ""
    return f" (in {name.group(1)}" + (f", line {line})" if line else ")")
