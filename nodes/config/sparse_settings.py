"""Sage Settings' sparse-attention choices as plain data (no ComfyUI import), checked where they are made.

Block-sparse attention (``kernels.sparse_attn``) for long self-attention calls, off by default. The
names and defaults follow ComfyUI core's "Model Sparse Attention" node where both have an option, so a
setting copied from one node means the same in the other: dense outside ``start_percent``..``end_percent``
of the schedule (sigma space, as every ComfyUI percent input), dense for the blocks in ``dense_layers``
(the block index the model reports), dense below ``min_tokens``.
"""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass

SPARSE_MODES = ("off", "sol", "top-k")  # sol: the tau threshold (Sol-Attn); top-k: a fixed share of key blocks
SINK_CHOICES = ("exact_kv_and_rows", "exact_kv", "off")
TAU_RANGE = (0.0, 4.0)
TOPK_RANGE = (0.01, 0.95)
EXTRA_TOKENS_STEP, EXTRA_TOKENS_MAX = 64, 256
# core's default; long enough that the dense kernel's time is dominated by the score matrix
DEFAULT_MIN_TOKENS = 12288
MAX_BLOCK_INDEX = 9999

_PART = re.compile(r"^(\d+)(?:\s*-\s*(\d+))?$")


def parse_dense_layers(text: str) -> frozenset[int]:
    """'0, 1, 47-49' -> {0, 1, 47, 48, 49}. Commas, semicolons or spaces between parts; a range is
    'a-b' with a <= b. Anything else raises ValueError naming the part and showing the form."""
    if text is None:
        return frozenset()
    if not isinstance(text, str):
        raise ValueError(f"dense_layers must be text such as '0, 1, 47-49', got {type(text).__name__}")
    # "a - b" is one part: the spaces round a dash are not separators
    parts = [p for p in re.split(r"[,;\s]+", re.sub(r"\s*-\s*", "-", text.strip())) if p]
    layers: set[int] = set()
    for part in parts:
        m = _PART.match(part)
        if m is None:
            raise ValueError(f"dense_layers: {part!r} is not a block index or a range; write block indices and "
                             "ranges such as '0, 1, 47-49'")
        first = int(m.group(1))
        last = int(m.group(2)) if m.group(2) is not None else first
        if last < first:
            raise ValueError(f"dense_layers: the range {part!r} runs backwards; write it as '{last}-{first}'")
        if last > MAX_BLOCK_INDEX:
            raise ValueError(f"dense_layers: block {last} is beyond {MAX_BLOCK_INDEX}; models have fewer blocks")
        layers.update(range(first, last + 1))
    return frozenset(layers)


def dense_layers_problem(text) -> str | None:
    """Why ``text`` is not a dense-layers list (the message for the node's validation), or None."""
    try:
        parse_dense_layers(text)
    except ValueError as e:
        return str(e)
    return None


def _number(name: str, value, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not low <= value <= high:
        raise ValueError(f"Sage Settings: {name} must be a number in {low}..{high}, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class SparseSettings:
    mode: str = "off"
    tau: float = 1.3
    topk_ratio: float = 0.1
    start_percent: float = 0.2
    end_percent: float = 1.0
    dense_layers: str = ""
    min_tokens: int = DEFAULT_MIN_TOKENS
    sink_conditioning: str = "exact_kv_and_rows"
    extra_tokens: int = 0

    def __post_init__(self):
        if self.mode not in SPARSE_MODES:
            raise ValueError(f"Sage Settings: sparse={self.mode!r} is not one of {', '.join(SPARSE_MODES)}")
        if self.sink_conditioning not in SINK_CHOICES:
            raise ValueError(f"Sage Settings: sparse_sink_conditioning={self.sink_conditioning!r} is not one of "
                             f"{', '.join(SINK_CHOICES)}")
        _number("sparse_tau", self.tau, *TAU_RANGE)
        _number("sparse_topk_ratio", self.topk_ratio, *TOPK_RANGE)
        start = _number("sparse_start_percent", self.start_percent, 0.0, 1.0)
        end = _number("sparse_end_percent", self.end_percent, 0.0, 1.0)
        if end < start:
            raise ValueError(f"Sage Settings: sparse_end_percent ({end}) is before sparse_start_percent ({start})")
        if isinstance(self.min_tokens, bool) or not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            raise ValueError(f"Sage Settings: sparse_min_tokens must be a length >= 0, got {self.min_tokens!r}")
        extra = self.extra_tokens
        if isinstance(extra, bool) or not isinstance(extra, int) or not 0 <= extra <= EXTRA_TOKENS_MAX \
                or extra % EXTRA_TOKENS_STEP:
            raise ValueError(f"Sage Settings: sparse_extra_tokens must be 0, 64, 128, 192 or 256, got {extra!r}")
        problem = dense_layers_problem(self.dense_layers)
        if problem is not None:
            raise ValueError(f"Sage Settings: {problem}")

    @property
    def enabled(self) -> bool:
        return self.mode != "off"

    @property
    def layers(self) -> frozenset[int]:
        return parse_dense_layers(self.dense_layers)

    def kernel_options(self) -> dict:
        """``sparse_attn``'s routing keywords for this choice (sinks are per call)."""
        if self.mode == "top-k":
            return {"tau": 1.3, "topk_ratio": self.topk_ratio, "extra_tokens": self.extra_tokens}
        return {"tau": self.tau, "topk_ratio": None, "extra_tokens": self.extra_tokens}

    def describe(self) -> str:
        """'sol tau 1.3' / 'top-k 10 %' for the run summary."""
        return f"top-k {self.topk_ratio * 100:g} %" if self.mode == "top-k" else f"sol tau {self.tau:g}"

    def replace(self, **kw) -> SparseSettings:
        return dataclasses.replace(self, **kw)


SPARSE_OFF = SparseSettings()

# Sage Settings' inputs -> SparseSettings fields
NODE_INPUTS = {"sparse": "mode", "sparse_tau": "tau", "sparse_topk_ratio": "topk_ratio",
               "sparse_start_percent": "start_percent", "sparse_end_percent": "end_percent",
               "sparse_dense_layers": "dense_layers", "sparse_min_tokens": "min_tokens",
               "sparse_sink_conditioning": "sink_conditioning", "sparse_extra_tokens": "extra_tokens"}


def split_node_choices(choices: dict) -> tuple[dict, SparseSettings]:
    """(the other choices, the sparse ones as SparseSettings) from Sage Settings' inputs; inputs left out
    (a workflow saved before they existed) keep their defaults."""
    rest = {k: v for k, v in choices.items() if k not in NODE_INPUTS}
    sparse = {NODE_INPUTS[k]: v for k, v in choices.items() if k in NODE_INPUTS}
    return rest, SparseSettings(**sparse)
