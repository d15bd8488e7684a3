"""Where the conditioning (text) tokens sit in a joint attention's sequence: sparse attention's sinks.

Joint-attention models (Flux, HunyuanVideo, Qwen-Image, SD3, AuraFlow, Lumina 2) attend text and image
tokens in one sequence; sparse attention keeps the text exact (as key blocks, and optionally as query
rows) so the prompt is never averaged away. Where the text is depends on the model:

- current core's MiniMax-H3 describes its packed sequence in ``transformer_options["minimax_h3_layout"]``
  (``seq_len`` and ``segments`` of ``(start, end, kind)``): everything before the video segment is
  conditioning, the target-audio rows run dense with "exact_kv_and_rows" (core's node reads it alike);
- every other model: a forward's text length is its ``c_crossattn``'s, and the side of the sequence the
  model puts it on is a property of the model class (``TEXT_PLACE``, checked per family on the real
  models by tests/test_sparse_models.py). An APPLY_MODEL wrapper writes both into the forward's
  ``transformer_options``; a self-attention call longer than the text then has the text at that side.

Models whose text only enters by cross-attention (Wan, LTX-Video, Cosmos) have no text in their
self-attention and get no sinks; so does any class not in the table.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Optional

BLOCK = 64  # the sparse kernel's block
TEXT_KEY = "sagetriton_text_tokens"  # per forward: (tokens before the text, text tokens, "first" | "last")
H3_LAYOUT_KEY = "minimax_h3_layout"
WRAPPER_KEY = "sagetriton_sparse_text"

# diffusion model class (module.qualname) -> (side of the joint sequence holding the text, learned tokens
# ahead of the text, as an attribute whose dim 1 counts them)
TEXT_PLACE = {
    "comfy.ldm.flux.model.Flux": ("first", None),  # Flux.1, Kontext, Flux.2: txt before img
    "comfy.ldm.chroma.model.Chroma": ("first", None),
    "comfy.ldm.qwen_image.model.QwenImageTransformer2DModel": ("first", None),
    "comfy.ldm.hunyuan_video.model.HunyuanVideo": ("last", None),  # img then txt
    "comfy.ldm.modules.diffusionmodules.mmdit.OpenAISignatureMMDITWrapper": ("first", None),  # SD3: context, x
    "comfy.ldm.aura.mmdit.MMDiT": ("first", "register_tokens"),  # 8 register tokens, then text, then image
    "comfy.ldm.lumina.model.NextDiT": ("first", None),  # Lumina 2, Z-Image: caption (padded), then image
}


def text_place(diffusion_model) -> Optional[tuple[str, int]]:
    """(side, tokens ahead of the text) for ``diffusion_model``'s joint attention, or None."""
    cls = type(diffusion_model)
    entry = TEXT_PLACE.get(f"{cls.__module__}.{cls.__qualname__}")
    if entry is None:
        return None
    side, ahead_attr = entry
    ahead = 0
    if ahead_attr is not None:
        extra = getattr(diffusion_model, ahead_attr, None)
        ahead = int(extra.shape[1]) if getattr(extra, "ndim", 0) >= 2 else 0
    return side, ahead


def make_text_wrapper(place_of: Callable) -> Callable:
    """An APPLY_MODEL wrapper writing this forward's text span (``TEXT_KEY``) into its transformer_options.
    ``place_of(base_model)``: ``text_place`` of its diffusion model (cached by the caller)."""

    def sagetriton_sparse_text(executor, *args, **kwargs):
        topts = args[5] if len(args) > 5 else None
        context = args[3] if len(args) > 3 else None
        if isinstance(topts, dict) and getattr(context, "ndim", 0) == 3:
            place = place_of(getattr(executor, "class_obj", None))
            if place is not None:
                topts[TEXT_KEY] = (place[1], int(context.shape[1]), place[0])
            else:
                topts.pop(TEXT_KEY, None)
        return executor(*args, **kwargs)

    return sagetriton_sparse_text


def _blocks(start: int, end: int) -> tuple[int, int]:
    """The 64-token blocks covering tokens [start, end)."""
    return start // BLOCK, -(-end // BLOCK)


def h3_sinks(layout, tokens: int, rows: bool) -> Optional[tuple[tuple[int, int], tuple[int, int]]]:
    """MiniMax-H3's packed prefix (text, audio, references) as (key blocks, query blocks), or None where
    the layout does not describe this call."""
    try:
        if int(layout.seq_len) != tokens:
            return None
        segments = [(int(a), int(b), str(kind)) for a, b, kind in layout.segments]
    except (AttributeError, TypeError, ValueError):
        return None
    video = next((a for a, _, kind in segments if kind == "video"), None)
    if video is None or video <= 0:
        return None
    keys = _blocks(0, video)
    if not rows:
        return keys, (0, 0)
    audio = next((a for a, _, kind in segments if kind == "audio"), None)
    return keys, (keys if audio is None else (audio // BLOCK, keys[1]))


def sinks_for(transformer_options: dict, tokens: int, mode: str) -> tuple[tuple[int, int], tuple[int, int], str]:
    """(sink key blocks, sink query blocks, where they came from) for a self-attention call of ``tokens``
    under Sage Settings' ``sparse_sink_conditioning`` ``mode``; empty ranges where there is no text."""
    none = ((0, 0), (0, 0), "")
    if mode == "off":
        return none
    rows = mode == "exact_kv_and_rows"
    layout = transformer_options.get(H3_LAYOUT_KEY)
    if layout is not None:
        found = h3_sinks(layout, tokens, rows)
        if found is not None:
            return (*found, "MiniMax-H3 layout")
    text = transformer_options.get(TEXT_KEY)
    if text is None:
        return none
    ahead, n, side = text
    span = ahead + n
    if n <= 0 or tokens <= span:  # not a joint call (the image or the text alone)
        return none
    keys = _blocks(0, span) if side == "first" else _blocks(tokens - span, tokens)
    return keys, (keys if rows else (0, 0)), f"text {side}"
