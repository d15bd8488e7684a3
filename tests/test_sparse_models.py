"""Sparse attention on the real ComfyUI runtime: tiny random-weight models sampled by ComfyUI's samplers.

- A Wan-like model long enough for sparse attention (6 x 8 x 8 = 384 video tokens, min tokens lowered):
  which calls run sparse by step and layer, each sparse call equal to the method's fp64 reference within
  the quantized kernel's error, the run summary and the Patch node's panel lines.
- Joint-attention families: the sinks sit on the text tokens, found by changing only the prompt.
- Composition with core's "Model Sparse Attention" (``core_sparse_node``, an emulation of core 0.38's
  node) in both orders, and with core's "Model Attention Backend" set after the Patch node.

Kernels run through the Triton interpreter on the CPU (a few seconds a call at 384 tokens).
"""
from __future__ import annotations

import pytest
import tiny_models
import torch
from core_sparse_node import RecordingSol, apply_core_sparse
from current_comfy import set_model_optimized_attention
from model_checks import KernelSpy
from sagetriton.kernels import sparse_reference as sref
from sagetriton.nodes.config.settings import SageSettings
from sagetriton.nodes.config.sparse_settings import SparseSettings
from sagetriton.nodes.patching import OVERRIDE_KEY, patch_model
from sagetriton.nodes.reporting import stats
from sagetriton.nodes.reporting.panel_text import run_lines
from sagetriton.nodes.routing import sparse_calls
from sagetriton.nodes.routing.conditioning_span import TEXT_KEY, sinks_for
from sagetriton.nodes.routing.dispatch import bind_call
from tiny_models import sample

pytestmark = pytest.mark.usefixtures("comfyui_path", "no_install_report")

LAYERS, FRAMES, SIZE = 2, 6, 16  # latent 6 x 16 x 16, patch 1 x 2 x 2: 384 tokens (6 blocks), 2 blocks deep
TOKENS = FRAMES * (SIZE // 2) ** 2
ALWAYS_KERNEL = dict(min_seq_len=0)


def wan_long(seed=0) -> tiny_models.TinyModel:
    cfg = dict(image_model="wan2.1", model_type="t2v", patch_size=(1, 2, 2), text_len=tiny_models.TEXT_TOKENS,
               in_dim=16, dim=256, ffn_dim=512, freq_dim=256, text_dim=tiny_models.TEXT_DIM, out_dim=16, num_heads=2,
               num_layers=LAYERS, window_size=(-1, -1), qk_norm=True, cross_attn_norm=True, eps=1e-6)
    g = torch.Generator().manual_seed(seed + 1)
    pos, neg = tiny_models._pair(g, lambda g: {})
    patcher = tiny_models._build("WAN21_T2V", cfg, torch.float16, seed)
    return tiny_models.TinyModel("wan_long", patcher, torch.zeros(1, 16, FRAMES, SIZE, SIZE), pos, neg, (128,))


class SparseCheck:
    """Runs the real sparse kernel on each call it gets and keeps its relative L2 to the method's fp64
    reference with the same options, next to the dense kernel's error to exact attention on the same
    inputs (the quantization error the sparse path shares)."""

    def __init__(self, monkeypatch, pack):
        self.calls: list[dict] = []
        self._real = pack.kernels.sparse_attn
        self._dense = pack.kernels.sageattn
        monkeypatch.setattr(pack.kernels, "sparse_attn", self)

    def __call__(self, q, k, v, **kw):
        out, density = self._real(q, k, v, **kw)
        layout = kw["tensor_layout"]
        ref = sref.sparse_reference(q, k, v, kw["tau"], tensor_layout=layout, scale=kw["scale"],
                                    sink_blocks=kw["sink_blocks"], sink_q=kw["sink_q"], topk_ratio=kw["topk_ratio"])
        exact = sref.dense_reference(q, k, v, tensor_layout=layout)
        dense = self._dense(q, k, v, layout, config=kw["config"])
        got = out if kw["out_layout"] == layout else out.transpose(1, 2)
        self.calls.append(dict(shape=tuple(q.shape), sinks=(kw["sink_blocks"], kw["sink_q"]), density=float(density),
                               error=_rel(got, ref), dense_error=_rel(dense, exact)))
        return out, density


def _rel(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


# --- Wan: steps, layers, calls, summary ------------------------------------------------------------

def test_wan_runs_sparse_in_its_window_and_layers_and_reports_it(monkeypatch, pack):
    """2 steps, start_percent 0.4: step 0 dense, step 1 sparse; block 0 dense by dense_layers. cond and
    uncond go through one forward per step: per forward 2 self-attention calls and 2 cross-attention."""
    t = wan_long()
    sparse = SparseSettings(mode="sol", min_tokens=256, start_percent=0.4, dense_layers="0")
    patched = patch_model(t.patcher, SageSettings(**ALWAYS_KERNEL, sparse=sparse), node_id="wan")
    check, dense = SparseCheck(monkeypatch, pack), KernelSpy(monkeypatch, pack)
    reference = sample(t, steps=2)
    out = sample(t, patched, steps=2)

    run = stats.runs_by_node()["wan"]
    assert len(check.calls) == 1 and check.calls[0]["shape"] == (2, TOKENS, 2, 128)
    assert len(dense.calls) == 7 and run["kernel"] == 8 and run["fallback"] == {}, run["text"]
    assert run["sparse"]["calls"] == 1 and run["sparse"]["dense"] == {
        sparse_calls.CROSS: 4, sparse_calls.DENSE_STEP: 2, sparse_calls.DENSE_LAYER: 1}
    # the kernel ran the method: within the quantization error of its fp64 reference
    for c in check.calls:
        assert c["error"] <= 1.5 * c["dense_error"] + 2e-3, c
        assert c["sinks"] == ([0, 0], [0, 0])  # Wan's text is in cross-attention: no sinks
    assert run["sparse"]["density"] == pytest.approx(check.calls[0]["density"], rel=1e-6)
    assert 0 < run["sparse"]["density"] < 1
    assert "sparse (sol tau 1.3): 1 calls" in run["text"] and "dense layer: 1" in run["text"]
    assert torch.isfinite(out).all() and not torch.equal(out, reference)
    assert "outer" not in run  # the Patch node's own override ran every call
    lines = panel_lines(run)
    at = next(i for i, line in enumerate(lines) if line.startswith("sparse "))
    assert lines[at].startswith("sparse sol tau 1.3: 1 calls · ") and lines[at].endswith("% blocks exact")
    assert lines[at + 1] == \
        "left dense: 4× cross-attention · 2× dense step (outside start/end percent) · 1× dense layer"


def panel_lines(run: dict) -> list:
    """The Patch node's panel lines for ``run``: the summary's own ``lines``, which the panel draws as sent."""
    assert run["lines"] == run_lines(run)  # made when the run ended, from the same summary
    return run["lines"]


# --- Joint attention: the sinks are the text -------------------------------------------------------

# family -> (ComfyUI model class, a latent of 64 image tokens or more). The text is 64 tokens with what comes
# before it (AuraFlow's 8 register tokens): one whole block, so a sink on the wrong side misses text rows.
JOINT = {"flux": ("Flux", (1, 16, 16, 16)), "chroma": ("Chroma", (1, 16, 16, 16)),
         "qwen_image": ("QwenImage", (1, 16, 1, 16, 16)), "hunyuan_video": ("HunyuanVideo", (1, 16, 4, 8, 8)),
         "sd3": ("SD3", (1, 16, 16, 16)), "aura_flow": ("AuraFlow", (1, 4, 8, 8)),  # its 16 positions: 16 tokens
         "lumina2": ("Lumina2", (1, 16, 16, 16)), "flux2": ("Flux2", (1, 128, 8, 8)),
         "z_image": ("ZImage", (1, 16, 16, 16))}


def with_prompt(t, latent_shape, tokens: int, seed: int) -> tiny_models.TinyModel:
    """``t`` with a latent of ``latent_shape`` and a random prompt of ``tokens`` tokens (padding masks all ones)."""
    g = torch.Generator().manual_seed(seed)

    def cond(c):
        extras = {k: (torch.ones(1, tokens, dtype=v.dtype) if k == "attention_mask" else v) for k, v in c[0][1].items()}
        return [[torch.randn(1, tokens, c[0][0].shape[-1], generator=g), extras]]

    return tiny_models.TinyModel(t.name, t.patcher, torch.zeros(latent_shape), cond(t.positive), cond(t.negative),
                                 t.head_dims, t.masks, t.cfg)


def first_joint_call(t, patched):
    """q of the first self-attention call longer than the text, as (B, L, H*D), and its transformer_options."""
    seen = []
    opts = patched.model_options["transformer_options"]
    inner = opts[OVERRIDE_KEY]

    def capture(func, *args, **kwargs):
        call = bind_call(args, kwargs)
        text = call.transformer_options.get(TEXT_KEY)
        if not seen and call.q_len == call.k_len and text is not None and call.q_len > text[0] + text[1]:
            q = call.q if not call.skip_reshape else call.q.transpose(1, 2).flatten(2)
            seen.append((q.float().clone(), dict(call.transformer_options)))
        return inner(func, *args, **kwargs)

    capture.sagetriton_state = inner.sagetriton_state
    opts[OVERRIDE_KEY] = capture
    try:
        sample(t, patched, steps=1)
    finally:
        opts[OVERRIDE_KEY] = inner
    assert seen, "no joint self-attention call"
    return seen[0]


@pytest.mark.parametrize("family", list(JOINT))
def test_the_sinks_are_the_text_tokens_of_each_joint_family(family):
    """Only the prompt changes between two runs: in the first joint attention call, the query rows that
    change are the text's (the image stream has not met the text yet). The sinks must cover them all,
    on the right side of the sequence, and no more than the text rounded out to whole 64-token blocks."""
    import comfy.supported_models

    model_class, latent = JOINT[family]
    if not hasattr(comfy.supported_models, model_class):
        pytest.skip(f"this ComfyUI has no {model_class} model class")
    t = getattr(tiny_models, f"tiny_{family}")()
    tokens = 64 - (8 if family == "aura_flow" else 0)
    settings = SageSettings(min_seq_len=1 << 20, sparse=SparseSettings(mode="sol", min_tokens=1 << 20))
    patched = patch_model(t.patcher, settings)  # nothing on a kernel: ComfyUI's attention, fast
    q1, topts = first_joint_call(with_prompt(t, latent, tokens, 1), patched)
    q2, _ = first_joint_call(with_prompt(t, latent, tokens, 2), patched)
    length = q1.shape[1]
    changed = ((q1 - q2).abs().amax(dim=(0, 2)) > 0).nonzero().flatten().tolist()
    keys, rows, where = sinks_for(topts, length, "exact_kv_and_rows")
    span = set(range(keys[0] * 64, min(keys[1] * 64, length)))
    assert length >= 128 or family == "aura_flow", length  # the image has a block of its own
    assert changed and set(changed) <= span, (family, changed, keys, where)
    ahead, n, side = topts[TEXT_KEY]
    # the text as the model gets it: ComfyUI pads Flux.2's to 512 tokens (the padding is text-stream too)
    assert n == (512 if family == "flux2" else tokens), (family, topts[TEXT_KEY])
    assert rows == keys and len(span) == min(length, -(-(ahead + n) // 64) * 64), (family, keys, topts[TEXT_KEY])
    assert (min(span) == 0) if side == "first" else (max(span) == length - 1)
    # the prompt's rows, all inside the text: after AuraFlow's register tokens, at the end for HunyuanVideo,
    # at the end of Flux.2's padded text (ComfyUI pads it in front)
    first_text = ahead if side == "first" else length - n
    assert len(changed) == tokens and changed == list(range(changed[0], changed[0] + tokens)), (family, changed)
    assert first_text <= changed[0] and changed[-1] < first_text + n, (family, changed[0], topts[TEXT_KEY])


def test_a_model_with_text_only_in_cross_attention_has_no_text_span(monkeypatch, pack):
    t = wan_long()
    patched = patch_model(t.patcher, SageSettings(min_seq_len=1 << 20, sparse=SparseSettings(mode="sol")))
    seen = []
    inner = patched.model_options["transformer_options"][OVERRIDE_KEY]

    def capture(func, *args, **kwargs):
        seen.append(kwargs["transformer_options"].get(TEXT_KEY, "absent"))
        return inner(func, *args, **kwargs)

    capture.sagetriton_state = inner.sagetriton_state
    patched.model_options["transformer_options"][OVERRIDE_KEY] = capture
    sample(t, patched, steps=1)
    assert seen and set(seen) == {"absent"}


# --- Composition with core's nodes ---------------------------------------------------------------------

def calls_per_run(t, steps) -> int:
    """Attention calls ComfyUI makes in one sampling run of ``t`` (a counting override, ComfyUI's attention)."""
    counted = [0]
    m = t.patcher.clone()

    def count(func, *args, **kwargs):
        counted[0] += 1
        return func(*args, **kwargs)

    m.model_options.setdefault("transformer_options", {})[OVERRIDE_KEY] = count
    sample(t, m, steps=steps)
    return counted[0]


@pytest.mark.parametrize("order", ["core_then_patch", "patch_then_core"])
def test_core_sparse_and_patch_model_attention_run_every_call_exactly_once(order, monkeypatch, pack):
    """Core's node takes step 1's self-attention calls (its window starts at 0.4); the calls it declines,
    its dense step 0 and every cross-attention, fall through to the pack's dense kernel; nothing runs twice
    and nothing reaches ComfyUI's own attention. The summary says who ran what."""
    t = wan_long()
    total = calls_per_run(t, steps=2)
    sol = RecordingSol()
    core = dict(kernel=sol, start_percent=0.4, min_tokens=256)
    if order == "core_then_patch":
        model = patch_model(apply_core_sparse(t.patcher, **core), SageSettings(**ALWAYS_KERNEL), node_id="p")
    else:
        model = apply_core_sparse(patch_model(t.patcher, SageSettings(**ALWAYS_KERNEL), node_id="p"), **core)
    spy = KernelSpy(monkeypatch, pack)
    out = sample(t, model, steps=2)

    run = stats.runs_by_node()["p"]
    assert total == 8 and len(sol.calls) == LAYERS  # step 1: both blocks' self-attention
    assert len(spy.calls) == run["kernel"] == total - LAYERS and run["fallback"] == {}, run["text"]
    assert run["outer"] | {"text": None} == {
        "name": "core's Model Sparse Attention", "label": "core's Model Sparse Attention", "forwards": 2,
        "calls": total, "reached": total - LAYERS, "ran_itself": LAYERS, "ours_unused": False, "text": None}
    assert f"core's Model Sparse Attention ran {LAYERS} calls itself, {total - LAYERS} fell through to SageTriton" \
        in run["text"]
    lines = panel_lines(run)
    assert f"core's Model Sparse Attention: {LAYERS} calls · {total - LAYERS} to SageTriton" in lines, lines
    if order == "core_then_patch":  # what the Patch node found on the hook serves its fallbacks
        assert "fallbacks run on core's Model Sparse Attention" in lines, lines
    assert torch.isfinite(out).all()


def test_a_backend_set_after_the_patch_node_is_reported_as_replacing_it(monkeypatch, pack):
    """Core's Model Attention Backend after Patch Model Attention writes the same override key: the
    pack's override never runs, and the summary and the panel say so."""
    import comfy.ldm.modules.attention as attention

    t = wan_long()
    total = calls_per_run(t, steps=1)
    patched = patch_model(t.patcher, SageSettings(**ALWAYS_KERNEL), node_id="p")
    later = patched.clone()
    set_model_optimized_attention(later, attention.attention_pytorch)
    spy = KernelSpy(monkeypatch, pack)
    sample(t, later, steps=1)

    run = stats.runs_by_node()["p"]
    assert spy.calls == [] and run["kernel"] == 0 and run["outer"]["ours_unused"]
    assert run["outer"]["calls"] == total and run["outer"]["label"] == "Model Attention Backend"
    assert "Patch Model Attention's override did not run" in run["text"] and "Model Attention Backend" in run["text"]
    assert "⚠ not running: Model Attention Backend replaced it" in panel_lines(run)


def test_a_backend_set_before_the_patch_node_serves_its_fallbacks_without_a_warning(monkeypatch, pack):
    import comfy.ldm.modules.attention as attention

    t = wan_long()
    earlier = t.patcher.clone()
    set_model_optimized_attention(earlier, attention.attention_pytorch)
    patched = patch_model(earlier, SageSettings(min_seq_len=1 << 20), node_id="p")
    sample(t, patched, steps=1)
    run = stats.runs_by_node()["p"]
    assert "outer" not in run and run["fallback_total"] > 0
