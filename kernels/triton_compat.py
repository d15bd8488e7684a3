"""What differs between the Triton versions the pack supports (3.6 to 3.9), decided in one place.

Names are chosen by what the installed Triton has, not by its version number, so a Triton between
or after the ones checked picks whichever spelling it offers. Each name below says which Triton
introduced or removed what it stands for (docs/COMPATIBILITY.md has the table).
"""
from __future__ import annotations

import os
import re
from contextlib import contextmanager
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


BLACKWELL_PTXAS_KNOB = "TRITON_PTXAS_BLACKWELL_PATH"
_sm90_ptxas: list = []  # [path or None], worked out once


def sm90_ptxas() -> Optional[str]:
    """The CUDA 12 ``ptxas`` to assemble the sm90 Gluon kernels with, where this Triton would take
    another: 3.9 assembles sm90 with ``ptxas-blackwell`` (CUDA 13.x), 3.6-3.8 with ``ptxas`` (CUDA 12),
    and 3.9's wheel still ships that one. None where sm90 gets ``ptxas`` already (3.8 and older), where
    no CUDA 12 ptxas is at hand, or where the user named the sm90 ptxas (``TRITON_PTXAS_BLACKWELL_PATH``).
    bench/NOTES.md ("Triton 3.9: why the Gluon kernel is slower") has why."""
    if not _sm90_ptxas:
        _sm90_ptxas.append(_find_sm90_ptxas())
    return _sm90_ptxas[0]


def _find_sm90_ptxas() -> Optional[str]:
    if os.environ.get(BLACKWELL_PTXAS_KNOB):
        return None
    try:
        from triton import knobs
        from triton.backends.nvidia import compiler

        if compiler.get_ptxas(90).path != knobs.nvidia.ptxas_blackwell.path:
            return None
        legacy = knobs.nvidia.ptxas
        if legacy.path == knobs.nvidia.ptxas_blackwell.path or not legacy.version.startswith("12."):
            return None
        return legacy.path
    except Exception:  # noqa: BLE001 - a Triton laid out otherwise: leave the choice to Triton
        return None


@contextmanager
def sm90_ptxas_scope(path: Optional[str] = None):
    """Triton builds inside the block assemble sm90 with ``path`` (default: ``sm90_ptxas()``; nothing
    changes where that is None). Triton caches the ptxas version (its cache key, the PTX version) and
    the LLVM features: they are reset on entry and exit, so builds after the block are Triton's own."""
    path = path or sm90_ptxas()
    if not path:
        yield
        return
    before = os.environ.get(BLACKWELL_PTXAS_KNOB)
    os.environ[BLACKWELL_PTXAS_KNOB] = path
    _reset_ptxas_caches()
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(BLACKWELL_PTXAS_KNOB, None)
        else:
            os.environ[BLACKWELL_PTXAS_KNOB] = before
        _reset_ptxas_caches()


def _reset_ptxas_caches() -> None:
    try:
        from triton.backends.nvidia import compiler
    except ImportError:
        return
    for name in ("get_ptxas_version", "get_features"):
        clear = getattr(getattr(compiler, name, None), "cache_clear", None)
        if clear is not None:
            clear()


def _executable(path) -> bool:
    return bool(path) and os.path.isfile(path) and os.access(path, os.X_OK)


ensure_ptxas()
