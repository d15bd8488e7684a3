"""What the model tests check on a patched tiny model: which calls reached the kernel, with which
masks, and how far each call and the sampled output are from ComfyUI's own attention.

Tolerances come from the kernel's accuracy on one attention call, not from the models: the worst
relative L1 and cosine of 64 calls on random inputs of the tiny models' shapes (4-64 tokens, head_dim
40-256, fp16 and bf16) through the interpreter, per P·V precision, widened by 10 % (``PER_CALL``;
fp16 P·V, the CPU default, measured 0.0130 where the README gives 0.013 at 8K tokens on the H200).
Each call on a model's real inputs must be within that; the sampled output too, since a model adds
attention to a residual stream.

The per-call check carries the weight: in tiny random-weight models attention hides behind small
modulation gates (uniform attention weights move a tiny Flux's prediction by only 0.2 %), so the
sampled output alone would not notice a broken kernel.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from sagetriton.kernels.reference import cosine, rel_l1
from sagetriton.nodes.patching import OVERRIDE_KEY

# P·V precision -> (largest relative L1, smallest cosine) of one call (see above; 2026-12-02, triton 3.8)
PER_CALL = {"fp16": (0.0143, 0.99991), "int8": (0.016, 0.99988), "fp8": (0.039, 0.9993),
            "fp8+residual": (0.027, 0.99967)}


@dataclass(frozen=True)
class Call:
    head_dim: int
    k_len: int
    masked: bool


def _describe(q, k, heads, mask, skip_reshape) -> Call:
    if skip_reshape:  # (B, H, L, D)
        return Call(q.shape[-1], k.shape[-2], mask is not None)
    return Call(q.shape[-1] // heads, k.shape[1], mask is not None)


class KernelSpy:
    """Records every call that reaches the kernel (``sagetriton.kernels.sageattn``) and lets it run."""

    def __init__(self, monkeypatch, pack):
        self.calls: list[Call] = []
        self.configs: dict[int, object] = {}  # head_dim -> the kernel config its calls ran with
        self._real = pack.kernels.sageattn
        monkeypatch.setattr(pack.kernels, "sageattn", self)

    def __call__(self, q, k, v, tensor_layout="HND", **kwargs):
        n_axis = 2 if tensor_layout == "HND" else 1
        call = Call(q.shape[-1], k.shape[n_axis], kwargs.get("attn_mask") is not None)
        self.calls.append(call)
        self.configs[call.head_dim] = kwargs.get("config")
        return self._real(q, k, v, tensor_layout=tensor_layout, **kwargs)

    @property
    def masked(self) -> int:
        return sum(c.masked for c in self.calls)

    @property
    def bounds(self) -> tuple[float, float]:
        """``PER_CALL`` of the P·V precision the calls ran with."""
        choices = {cfg.pv_choice() for cfg in self.configs.values()}
        assert len(choices) == 1, f"calls ran with P·V precisions {choices}"
        return PER_CALL[choices.pop()]


def _mask_of(args: tuple, kwargs: dict):
    return kwargs["mask"] if "mask" in kwargs else (args[4] if len(args) > 4 else None)


def _without_mask(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    if "mask" in kwargs:
        return args, {**kwargs, "mask": None}
    if len(args) > 4:
        return args[:4] + (None,) + args[5:], kwargs
    return args, kwargs


@dataclass
class CheckedCall:
    call: Call
    rel_l1: float  # the patched call against ComfyUI's own attention on the same inputs and mask
    cosine: float
    mask_effect: float  # how far ComfyUI's own attention moves when the mask is left out (0 without one)


def check_every_call(patched) -> list[CheckedCall]:
    """Make the patched MODEL also run ComfyUI's own attention (the ``func`` ComfyUI hands the override)
    on every call's inputs, with the call's mask, and record how far the patched result is from it."""
    opts = patched.model_options["transformer_options"]
    inner = opts[OVERRIDE_KEY]
    checked: list[CheckedCall] = []

    def checking_override(func, *args, **kwargs):
        out = inner(func, *args, **kwargs)
        exact = func(*args, **kwargs)
        mask = _mask_of(args, kwargs)
        unmasked_args, unmasked_kwargs = _without_mask(args, kwargs)
        effect = 0.0 if mask is None else rel_l1(func(*unmasked_args, **unmasked_kwargs), exact)
        # ComfyUI's backend signature: (q, k, v, heads, mask, attn_precision, skip_reshape, ...)
        heads = args[3] if len(args) > 3 else kwargs.get("heads")
        skip = kwargs.get("skip_reshape", args[6] if len(args) > 6 else False)
        call = _describe(args[0], args[1], heads, mask, skip)
        checked.append(CheckedCall(call, rel_l1(out, exact), cosine(out, exact), effect))
        return out

    checking_override.sagetriton_state = inner.sagetriton_state
    opts[OVERRIDE_KEY] = checking_override
    return checked


def without_masks(tiny):
    """The same tiny model with its text as if unpadded: every attention mask all ones (LTX-Video's
    model requires a mask argument, so the masks are filled rather than removed)."""
    import dataclasses

    def unpadded(conditioning):
        return [[c, {k: (torch.ones_like(v) if k == "attention_mask" else v) for k, v in extras.items()}]
                for c, extras in conditioning]

    return dataclasses.replace(tiny, positive=unpadded(tiny.positive), negative=unpadded(tiny.negative), masks=False)


def assert_close(out: torch.Tensor, reference: torch.Tensor, what: str, bounds: tuple[float, float]) -> None:
    assert torch.isfinite(out).all(), f"{what}: non-finite output"
    assert not torch.equal(out, reference), f"{what}: identical to the unpatched output (did the kernel run?)"
    err, cos = rel_l1(out, reference), cosine(out, reference)
    assert err <= bounds[0] and cos >= bounds[1], f"{what}: rel L1 {err:.5f}, cosine {cos:.7f}"


def assert_calls_close(checked: list[CheckedCall], what: str, bounds: tuple[float, float]) -> None:
    """Every call within one call's accuracy of ComfyUI's own attention; where a mask matters, far
    closer to the masked result than leaving the mask out would be."""
    assert checked, f"{what}: no attention call was checked"
    for c in checked:
        assert c.rel_l1 <= bounds[0] and c.cosine >= bounds[1], f"{what}: {c}"
        if c.mask_effect:
            assert c.rel_l1 < c.mask_effect / 5, f"{what}: the mask barely shows: {c}"


__all__ = ["PER_CALL", "Call", "KernelSpy", "assert_calls_close", "assert_close",
           "CheckedCall", "check_every_call", "without_masks"]
