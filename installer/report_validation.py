"""What a report may hold: ``report_problem`` checks the types and ranges of everything the runtime reads, the
one place a report read back from disk is validated (``report._read``)."""
from __future__ import annotations

from typing import Optional

from ..kernels.arch import PV_PRECISIONS

SCHEMA = 1
# Real reports are a few KB and about 6 levels deep; anything deeper is tampered and must not reach a reader's
# recursion.
MAX_DEPTH = 32
MAX_SEQ_LEN = 1 << 24  # a crossover key length; x16 (fp8+residual) x2 (never faster) still fits an int32
MAX_HEAD_DIM = 256


def _is_int(v, lo: int = 0, hi: int = MAX_SEQ_LEN) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def _is_head_size_key(d) -> bool:
    """A JSON key naming a head size: ASCII digits ("²" is a digit to str.isdigit, not to int()), 1..256."""
    return isinstance(d, str) and d.isascii() and d.isdigit() and len(d) <= 3 and 1 <= int(d) <= MAX_HEAD_DIM


def _too_deep(obj, limit: int = MAX_DEPTH) -> bool:
    """Whether ``obj`` nests deeper than ``limit`` (iterative: the check itself must not recurse)."""
    stack = [(obj, 1)]
    while stack:
        o, depth = stack.pop()
        if isinstance(o, (dict, list)):
            if depth > limit:
                return True
            stack.extend((v, depth + 1) for v in (o.values() if isinstance(o, dict) else o))
    return False


def _crossover_problem(c, where: str = "crossover") -> Optional[str]:
    if c is None:
        return None
    if not isinstance(c, dict):
        return f"{where} is {type(c).__name__}, not an object"
    if c.get("seq_len") is not None and not _is_int(c["seq_len"]):
        return f"{where}.seq_len is {_short(c['seq_len'])}, not a whole number from 0 to {MAX_SEQ_LEN}"
    if c.get("head_dim") is not None and not _is_int(c["head_dim"], 1, MAX_HEAD_DIM):
        return f"{where}.head_dim is {_short(c['head_dim'])}, not a whole number from 1 to {MAX_HEAD_DIM}"
    if not isinstance(c.get("timings", []), list) or any(
            not isinstance(t, dict) or ("seq_len" in t and not _is_int(t["seq_len"])) for t in c.get("timings", [])):
        return f"{where}.timings is not a list of timings with seq_len from 0 to {MAX_SEQ_LEN}"
    by_dim = c.get("by_head_dim")
    if by_dim is None:
        return None
    if not isinstance(by_dim, dict):
        return f"{where}.by_head_dim is {type(by_dim).__name__}, not an object"
    for d, sub in by_dim.items():
        if not _is_head_size_key(d):
            return f"{where}.by_head_dim has key {_short(d)}, not a head size 1-{MAX_HEAD_DIM}"
        problem = _crossover_problem(sub, f"{where}.by_head_dim[{d}]")
        if problem or (sub or {}).get("by_head_dim") is not None:
            return problem or f"{where}.by_head_dim[{d}] nests another by_head_dim"
    return None


def report_problem(data, key: Optional[dict] = None) -> Optional[str]:
    """Why ``data`` is not a usable report (types and ranges of what the runtime reads), or None when it is."""
    if not isinstance(data, dict):
        return f"the report is {type(data).__name__}, not an object"
    if _too_deep(data):
        return f"nested deeper than {MAX_DEPTH} levels"
    if data.get("schema") != SCHEMA:
        return f"schema {_short(data.get('schema'))}, expected {SCHEMA}"
    if key is not None and data.get("key") != key:
        return "made for another pack, kernel, torch, triton or GPU"
    variants = data.get("variants", {})
    if not isinstance(variants, dict) or any(
            not isinstance(v, dict) or any(not isinstance(v.get(s, {}), dict) for s in ("build", "selftest"))
            for v in variants.values()):
        return "variants is not an object of {build, selftest} objects"
    off = data.get("disabled_variants", [])
    if not isinstance(off, list) or any(not isinstance(v, str) for v in off):
        return "disabled_variants is not a list of names"
    for field in ("sdpa_default_safe", "complete", "quick"):
        if data.get(field) is not None and not isinstance(data[field], bool):
            return f"{field} is {_short(data[field])}, not true/false"
    if data.get("attempts") is not None and not _is_int(data["attempts"], 1):
        return f"attempts is {_short(data['attempts'])}, not a whole number >= 1"
    for field in ("long_sequence_kernel", "rope_kernel"):
        if data.get(field) is not None and not isinstance(data[field], dict):
            return f"{field} is not an object"
    problem = _pv_choice_problem(data.get("pv_choice"))
    return problem or _crossover_problem(data.get("crossover"))


def _pv_choice_problem(c) -> Optional[str]:
    if c is None:
        return None
    by = c.get("by_head_dim") if isinstance(c, dict) else None
    if not isinstance(by, dict):
        return "pv_choice is not an object with by_head_dim"
    for d, e in by.items():
        if not _is_head_size_key(d) or not isinstance(e, dict):
            return f"pv_choice.by_head_dim[{_short(d)}] is not a head size's entry"
        if e.get("choice") is not None and e["choice"] not in PV_PRECISIONS:
            return f"pv_choice.by_head_dim[{d}].choice is {_short(e['choice'])}, not one of {', '.join(PV_PRECISIONS)}"
        ms = e.get("ms", {})
        if not isinstance(ms, dict) or any(not isinstance(t, (int, float)) or isinstance(t, bool) or not t > 0
                                           for t in ms.values()):
            return f"pv_choice.by_head_dim[{d}].ms is not an object of positive times"
    return None


def _short(value, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters: a tampered value can be megabytes long."""
    big = isinstance(value, int) and value.bit_length() >= 200  # repr() refuses ints over 4,300 digits
    text = f"a {value.bit_length()}-bit number" if big else repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
