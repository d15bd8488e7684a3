"""Why a call does not run on the kernel, or stays dense with sparse attention on: one named member each.

A member's value is the text users see (counters, logs, the run summary). A reason with a number or name
in it is ``Because``: that text, carrying its member. The counters, the log level (``stats``) and the run
summary's hints (``run_summary``) ask ``reason_of(text)`` for the member, never match the text, so a
reworded message changes only what is shown.
"""
from __future__ import annotations

from enum import Enum
from typing import Optional


class Reason(str, Enum):
    """Kernel-or-fallback reasons (``routing.attention_call``, ``routing.dispatch``, the non-finite guard) and
    the sparse path's "left dense" reasons (``routing.sparse_calls``). Templates take ``of(...)``'s values."""

    # The call's own arguments, whatever the GPU and settings (``attention_call.call_fallback_reason``).
    LOW_PRECISION_OFF = "accuracy-critical call (low_precision_attention=False)"
    UNSUPPORTED_ARGUMENT = "unsupported argument {!r}"
    NOT_A_GPU = "{} device is not a CUDA/ROCm GPU"
    DTYPE = "dtype {}"
    DTYPES_DIFFER = "q, k, v dtypes differ"
    FP32_PRECISION = "fp32 attn_precision requested"
    HEAD_DIM = "head_dim {} outside 1..{}"
    EMPTY_CALL = "empty q or k (no batch or no tokens)"
    BAD_SCALE = "scale not a finite number"
    NOT_BHLD = "q, k, v not (B, H, L, D)"
    Q_WIDTH = "q width not a multiple of heads"
    KV_WIDTH = "k or v width not a multiple of heads"
    KV_RANK = "k or v neither (B, L, H*D) nor (B, L, H, D)"
    BATCHES_DIFFER = "q, k, v batch sizes differ"
    DEVICES_DIFFER = "q, k, v on different devices"
    KV_LENGTHS_DIFFER = "k and v lengths differ"
    HEADS_NOT_MULTIPLE = "query heads not a multiple of key heads"
    V_HEAD_SIZE = "v head size differs from q/k"
    MASK_NOT_TENSOR = "mask is not a tensor"
    MASK_DTYPE = "mask dtype {}"
    MASK_RANK = "mask with {} dimensions"
    MASK_SHAPE = "mask shape not broadcastable to (B, H, Lq, Lk)"
    MASK_DEVICE = "mask on another device"
    NEEDS_GRAD = "needs gradients (training)"
    UNRECOGNISED_CALL = "unrecognised call signature"
    # The plan for this GPU, head size and settings (``dispatch``).
    FULL_PRECISION_STEP = "full-precision step"
    NO_VARIANT = "no kernel variant passed the install self-test"
    KEY_TOO_SHORT = "key length < {}"
    WORK_TOO_SMALL = "work per call < {} (batch x heads x Lq x Lk)"
    VARIANT_DISABLED = "kernel failed (variant disabled until restart)"
    REFUSED_ARGUMENTS = "arguments the kernel refuses (the caller's; nothing disabled)"
    NON_FINITE_REDO = "non-finite output: forward redone on ComfyUI's attention"
    # Left dense while sparse attention is on (counted apart from fallbacks).
    CROSS = "cross-attention"
    MASKED = "mask (sparse cannot honour it)"
    SMALL_HEADS = "head_dim < {}"
    DENSE_STEP = "dense step (outside start/end percent)"
    DENSE_LAYER = "dense layer"
    SPARSE_FAILED = "sparse kernel failed here (dense from now on)"
    SHORT_FOR_SPARSE = "< {} tokens"

    # Shown as their text (``str()``, ``format()``, ``%s``), as the plain strings they replace were.
    __str__ = str.__str__
    __format__ = str.__format__

    def of(self, *values) -> Because:
        """This reason's text with ``values`` in its template."""
        return Because(self.value.format(*values), self)


class Because(str):
    """A reason's text with its values filled in, carrying its ``Reason`` member (``reason_of``)."""

    reason: Reason

    def __new__(cls, text: str, reason: Reason) -> Because:
        self = super().__new__(cls, text)
        self.reason = reason
        return self

    def __reduce__(self):  # copies and pickles keep the member
        return Because, (str(self), self.reason)


# Routing policy, not problems: logged at INFO, the others at WARNING.
TOO_SHORT = frozenset({Reason.KEY_TOO_SHORT, Reason.WORK_TOO_SMALL})  # run_summary: "leave this model unpatched"
POLICY = TOO_SHORT | {Reason.FULL_PRECISION_STEP, Reason.LOW_PRECISION_OFF, Reason.NEEDS_GRAD}


def reason_of(text) -> Optional[Reason]:
    """The member behind a counted reason (a member itself or ``Because``), None for any other text."""
    if isinstance(text, Reason):
        return text
    return getattr(text, "reason", None)
