"""Peak GPU memory with q, k, v handed over in current ComfyUI's single-owner containers, against
today's tensors that the calling model keeps alive through the call.

    COMFYUI_PATH=... python bench/container_memory.py [--out ...]   (--tiny: CPU smoke test)

One attention call in Wan's (B, L, H·D) layout at 1×40×32760×128 (Wan 2.1 14B, 480×832, 81 frames),
and one forward of the cond+uncond batch through ComfyUI's Wan model class at the 14B's layer sizes
(2 of its 40 blocks: the peak of a forward is one block's). The container variant runs ComfyUI
0.3.64's Wan self-attention rewritten the way current ComfyUI's models call attention (projections
wrapped in holders just before the call), through an emulation of the current ``wrap_attn``
(``tests/current_comfy.py``). Peak = max_memory_allocated during the call or forward minus what was
allocated before it (inputs and weights included in that baseline).
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the current-ComfyUI emulation
import bench_models as bm  # noqa: E402  (sets ComfyUI up, CPU mode with --tiny)
import comfy.ldm.modules.attention as attention  # noqa: E402
import comfy.ldm.wan.model as wan  # noqa: E402
import torch  # noqa: E402
from common import RESULTS, cosine, environment, write_json  # noqa: E402
from current_comfy import Holder, current_wrap_attn  # noqa: E402
from sagetriton.nodes.config.settings import SageSettings  # noqa: E402
from sagetriton.nodes.patching import patch_model  # noqa: E402
from sagetriton.nodes.reporting.stats import attention_stats  # noqa: E402

MIB = 1 << 20
WAN_14B_2_BLOCKS = dict(bm.WAN_1_3B, dim=5120, ffn_dim=13824, num_heads=40, num_layers=2)


def peak_of(fn, *args, **kwargs):
    """(fn's result, peak MiB above what was allocated before it); None without a GPU."""
    if bm.DEVICE != "cuda":
        return fn(*args, **kwargs), None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn(*args, **kwargs)
    torch.cuda.synchronize()
    return out, (torch.cuda.max_memory_allocated() - base) / MIB


def current_global():
    """ComfyUI's global attention as current ComfyUI wraps it (containers understood)."""
    return current_wrap_attn(attention.optimized_attention.__wrapped__)


def one_call(shape, runs: int = 3) -> list:
    b, h, n, d = shape
    patched = patch_model(bm.comfy.model_patcher.ModelPatcher(torch.nn.Linear(1, 1), torch.device(bm.DEVICE),
                                                              torch.device(bm.DEVICE)), SageSettings())
    state_options = patched.model_options["transformer_options"]
    backend = current_global()
    rows = []
    ref = None

    def inputs(seed):
        g = torch.Generator(device=bm.DEVICE).manual_seed(seed)
        return [torch.randn((b, n, h * d), generator=g, device=bm.DEVICE, dtype=torch.bfloat16) for _ in range(3)]

    for label, options, holders in (("ComfyUI's attention (SDPA), tensors", {}, False),
                                    ("SageTriton, tensors the caller keeps", state_options, False),
                                    ("SageTriton, containers", state_options, True)):
        peaks = []
        for i in range(runs):  # the first container call of a variant keeps the floats; later ones release
            qkv = inputs(i)
            args = [Holder(t) for t in qkv] if holders else qkv
            if holders:
                del qkv
            out, peak = peak_of(backend, *args, h, transformer_options=options)
            peaks.append(peak)
            if i == 0 and ref is None:
                ref = out.float()
            if i == 0:
                cos = cosine(out.float(), ref)
            del args, out
        rows.append(dict(kind="call", variant=label, shape=list(shape), peak_mib=peaks[-1], peaks_mib=peaks,
                         inputs_mib=3 * b * n * h * d * 2 / MIB, cosine_to_sdpa=cos))
        print(rows[-1], flush=True)
    return rows


def current_style_self_attention(self, x, freqs, transformer_options={}):  # noqa: B006 (ComfyUI's signature)
    """0.3.64's WanSelfAttention.forward, calling attention as current ComfyUI's models do: each
    projection goes into a holder as it is made, so the call owns the only reference."""
    b, s, n, d = *x.shape[:2], self.num_heads, self.head_dim
    q = Holder(wan.apply_rope1(self.norm_q(self.q(x)).view(b, s, n, d), freqs).view(b, s, n * d))
    k = Holder(wan.apply_rope1(self.norm_k(self.k(x)).view(b, s, n, d), freqs).view(b, s, n * d))
    v = Holder(self.v(x).view(b, s, n * d))
    return self.o(current_global()(q, k, v, heads=n, transformer_options=transformer_options))


def one_forward(runs: int = 3) -> list:
    bm.MODELS["wan14_2blocks"] = ("WAN21_T2V", WAN_14B_2_BLOCKS, *bm.MODELS["wan21"][2:])
    if bm.DEVICE != "cuda":
        bm.MODELS["wan14_2blocks"] = ("WAN21_T2V", {**WAN_14B_2_BLOCKS, **bm.TINY["wan21"]}, (1, 16, 2, 8, 8), 16, 64,
                                      lambda g: {})
    base = bm.build("wan14_2blocks")
    x, sigma, kwargs = bm.forward_inputs(base, "wan14_2blocks")
    patched = patch_model(base, SageSettings())
    rows, ref = [], None
    original = wan.WanSelfAttention.forward
    for label, patcher, current_style in (("unpatched (ComfyUI's attention), today's call", base, False),
                                          ("patched, today's call (model keeps q, k, v)", patched, False),
                                          ("patched, containers (current ComfyUI's call)", patched, True)):
        wan.WanSelfAttention.forward = current_style_self_attention if current_style else original
        try:
            peaks = []
            kernel_before = attention_stats()["kernel"]
            for _ in range(runs):
                topts = dict(patcher.model_options.get("transformer_options", {}))
                with torch.no_grad():
                    out, peak = peak_of(patcher.model.apply_model, x, sigma, transformer_options=topts, **kwargs)
                peaks.append(peak)
            ref = out.float() if ref is None else ref
            rows.append(dict(kind="wan_forward", variant=label, model="Wan 2.1 14B layer sizes, 2 of 40 blocks",
                             latent=list(x.shape), peak_mib=peaks[-1], peaks_mib=peaks,
                             kernel_calls=(attention_stats()["kernel"] - kernel_before) // runs,
                             cosine_to_unpatched=cosine(out.float(), ref)))
            print(rows[-1], flush=True)
            del out
        finally:
            wan.WanSelfAttention.forward = original
    return rows


def main(argv=None):
    import argparse

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tiny", action="store_true", help="tiny shapes on the CPU: checks this script")
    ap.add_argument("--out", default=None)
    ap.add_argument("--skip-forward", action="store_true")
    args = ap.parse_args(argv)
    if args.tiny:
        bm.shrink_for_cpu_smoke_test()
    shape = (1, 2, 64, 64) if args.tiny else (1, 40, 32760, 128)
    payload = {"env": environment(), "rows": one_call(shape)}
    if not args.skip_forward:
        payload["rows"] += one_forward()
    for r in payload["rows"]:
        peak = r["peak_mib"] if r["peak_mib"] is None else round(r["peak_mib"])
        print(f"{r['kind']:>12} {r['variant']:>48} peak {peak} MiB")
    default = RESULTS.parent / "out" / "container_memory_tiny.json" if args.tiny else RESULTS / "container_memory.json"
    write_json(Path(args.out) if args.out else default, payload)


if __name__ == "__main__":
    main()
