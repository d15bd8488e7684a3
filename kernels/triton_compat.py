"""What differs between the Triton versions the pack supports (3.6 to 3.9), decided in one place.

Names are chosen by what the installed Triton has, not by its version number, so a Triton between
or after the ones checked picks whichever spelling it offers. Each name below says which Triton
introduced or removed what it stands for (docs/COMPATIBILITY.md has the table).

Also here: ``root_cause``, the one readable line of why a kernel could not be built, used wherever
such an error is logged or reported.
"""
from __future__ import annotations

import os
import re
from typing import Optional

try:
    import triton

    TRITON_VERSION = tuple(int(x) for x in re.findall(r"\d+", triton.__version__)[:2])
except ImportError:  # kernels/ is importable without Triton (the doctor reports it)
    TRITON_VERSION = (0, 0)

try:
    from triton.experimental.gluon import language as _gl
    from triton.experimental.gluon.language.nvidia.hopper import tma as _tma

    # TMA copy global -> shared: ``async_load`` from 3.8; 3.6/3.7 have only ``async_copy_global_to_shared``,
    # which 3.8 keeps as an alias and 3.9 turns into a function that raises "has been removed".
    tma_load = getattr(_tma, "async_load", None) or _tma.async_copy_global_to_shared
    # A barrier over the calling partition's warps: ``thread_barrier`` in 3.6, ``barrier`` (cluster=False
    # by default) from 3.7, where ``thread_barrier`` is gone.
    partition_barrier = getattr(_gl, "barrier", None) or _gl.thread_barrier
    GLUON = True
except ImportError:  # no Gluon (Triton < 3.5): hopper_gluon reports itself unavailable
    tma_load = partition_barrier = None
    GLUON = False


def ensure_ptxas() -> None:
    """Triton 3.9 builds sm90 and newer with ``ptxas-blackwell`` (knob ``TRITON_PTXAS_BLACKWELL_PATH``) and
    fails without it, where builds that ship only ``ptxas`` (or a user's ``TRITON_PTXAS_PATH``) would do:
    point it at that ptxas. Nothing happens where that tool exists, the user set it, or this Triton has
    no such knob (3.8 and older: one ptxas for every arch). Runs no tool: file checks only."""
    if os.environ.get("TRITON_PTXAS_BLACKWELL_PATH"):
        return
    try:
        from triton import knobs

        tools = type(knobs.nvidia).__dict__
        if "ptxas_blackwell" not in tools:
            return
        if _executable(tools["ptxas_blackwell"].default_path):
            return
        ptxas = os.environ.get("TRITON_PTXAS_PATH") or tools["ptxas"].default_path
    except Exception:  # noqa: BLE001 - Triton's knobs look otherwise: leave the choice to Triton
        return
    if _executable(ptxas):
        os.environ["TRITON_PTXAS_BLACKWELL_PATH"] = ptxas


def _executable(path) -> bool:
    return bool(path) and os.path.isfile(path) and os.access(path, os.X_OK)


ensure_ptxas()


# ---------------------------------------------------------------------------------------------
# Why a kernel could not be built, in one line

_CARET = re.compile(r"^\s*\^+\s*$")
_REPR = re.compile(r"^(\w+(?:\.\w+)*)\((['\"])(.*)\2,?\)$", re.S)
MAX_CAUSE = 300


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
    # Compiler tools (ptxas, MLIR passes) print context first and the line naming the error later.
    errors = [ln for ln in lines if re.search(r"\berror\b", ln, re.I)]
    text = errors[0] if errors else lines[-1]
    return f"{type(exc).__name__}: {' '.join(text.split())}"


def _where(exc) -> str:
    """`` (in fn, line N)`` of a CompilationError, N counted in the function's own source."""
    name = re.search(r"def\s+(\w+)", exc.src or "")
    line = getattr(exc.node, "lineno", None)
    if not name:
        return ""
    return f" (in {name.group(1)}" + (f", line {line})" if line else ")")
