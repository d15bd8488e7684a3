"""Tiny random-weight ComfyUI models of the real architectures, for tests and bench/.

Each builder returns a ``TinyModel``: a real ``comfy.model_patcher.ModelPatcher`` around a real
ComfyUI model class (built through ``comfy.supported_models``), plus a latent and conditioning of
the right shapes. Sizes are chosen so attention sequences stay around 16-64 tokens (the Triton
interpreter is slow). ComfyUI must already be importable (the conftest prepares it); nothing from
ComfyUI is imported at module level.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

TEXT_TOKENS = 8
TEXT_DIM = 32


@dataclass
class TinyModel:
    name: str
    patcher: object  # comfy.model_patcher.ModelPatcher
    latent: torch.Tensor  # zeros: an empty latent, as EmptyLatentImage gives
    positive: list  # ComfyUI conditioning: [[cross_attn, {extras}]]
    negative: list
    head_dims: tuple[int, ...]
    masks: bool = False  # whether attention calls carry masks
    cfg: float = 2.0  # 1.0 where ComfyUI's model only takes text masks at batch 1 (HunyuanVideo, padded Lumina2)
    notes: dict = field(default_factory=dict)


def _fill_random_(module: torch.nn.Module, generator: torch.Generator, scale: float = 0.05) -> None:
    """ComfyUI's ops leave weights uninitialised: give every parameter and buffer small random values."""
    with torch.no_grad():
        for name, p in list(module.named_parameters()) + list(module.named_buffers()):
            if not p.dtype.is_floating_point:
                continue
            values = torch.randn(p.shape, generator=generator, dtype=torch.float32) * scale
            if name.endswith(".weight") and p.ndim == 1:  # norm gains near 1 keep activations sane
                values += 1.0
            p.copy_(values.to(p.dtype))


def _build(config_cls_name: str, unet_config: dict, dtype: torch.dtype, seed: int, head_overrides=None):
    import comfy.model_management
    import comfy.model_patcher
    import comfy.supported_models

    config = getattr(comfy.supported_models, config_cls_name)(dict(unet_config))
    # The config class forces its real head layout (unet_extra_config); tiny UNets need their own.
    config.unet_config.update(head_overrides or {})
    config.set_inference_dtype(dtype, None)
    model = config.get_model({})
    _fill_random_(model.diffusion_model, torch.Generator().manual_seed(seed))
    model.eval()
    device = comfy.model_management.get_torch_device()
    return comfy.model_patcher.ModelPatcher(model, load_device=device, offload_device=device)


def _text(generator: torch.Generator, tokens: int = TEXT_TOKENS, dim: int = TEXT_DIM) -> torch.Tensor:
    return torch.randn(1, tokens, dim, generator=generator)


def _pair(generator: torch.Generator, make_extras: Callable[[torch.Generator], dict], tokens=TEXT_TOKENS,
          dim=TEXT_DIM) -> tuple[list, list]:
    positive = [[_text(generator, tokens, dim), make_extras(generator)]]
    negative = [[_text(generator, tokens, dim), make_extras(generator)]]
    return positive, negative


def _text_mask(valid: int, tokens: int = TEXT_TOKENS) -> torch.Tensor:
    """Padding mask as text encoders give it: 1 for real tokens, 0 for padding."""
    mask = torch.zeros(1, tokens, dtype=torch.long)
    mask[:, :valid] = 1
    return mask


def tiny_flux(dtype=torch.bfloat16, seed=0) -> TinyModel:
    cfg = dict(image_model="flux", in_channels=16, out_channels=16, vec_in_dim=TEXT_DIM, context_in_dim=TEXT_DIM,
               hidden_size=256, mlp_ratio=2.0, num_heads=2, depth=1, depth_single_blocks=1, axes_dim=[16, 56, 56],
               theta=10000, patch_size=2, qkv_bias=True, guidance_embed=True)
    g = torch.Generator().manual_seed(seed + 1)
    pos, neg = _pair(g, lambda g: {"pooled_output": torch.randn(1, TEXT_DIM, generator=g), "guidance": 3.5})
    return TinyModel("flux", _build("Flux", cfg, dtype, seed), torch.zeros(1, 16, 8, 8), pos, neg, (128,))


def tiny_wan21(dtype=torch.float16, seed=0) -> TinyModel:
    cfg = dict(image_model="wan2.1", model_type="t2v", patch_size=(1, 2, 2), text_len=TEXT_TOKENS, in_dim=16,
               dim=256, ffn_dim=512, freq_dim=256, text_dim=TEXT_DIM, out_dim=16, num_heads=2, num_layers=1,
               window_size=(-1, -1), qk_norm=True, cross_attn_norm=True, eps=1e-6)
    g = torch.Generator().manual_seed(seed + 1)
    pos, neg = _pair(g, lambda g: {})
    return TinyModel("wan21", _build("WAN21_T2V", cfg, dtype, seed), torch.zeros(1, 16, 2, 8, 8), pos, neg, (128,))


def _unet_config(model_channels, context_dim, adm_in_channels, linear, transformer_depth) -> dict:
    levels = len(transformer_depth)
    return dict(use_checkpoint=False, image_size=32, in_channels=4, out_channels=4, model_channels=model_channels,
                num_res_blocks=[1] * levels, channel_mult=[1, 2][:levels], transformer_depth=list(transformer_depth),
                transformer_depth_output=[d for d in transformer_depth for _ in range(2)],
                transformer_depth_middle=transformer_depth[-1], use_spatial_transformer=True, legacy=False,
                context_dim=context_dim, adm_in_channels=adm_in_channels, use_linear_in_transformer=linear,
                use_temporal_attention=False,
                num_classes="sequential" if adm_in_channels else None,
                use_temporal_resblock=False)


def tiny_sd15(dtype=torch.float16, seed=0) -> TinyModel:
    cfg = _unet_config(32, TEXT_DIM, None, False, transformer_depth=(1, 1))
    g = torch.Generator().manual_seed(seed + 1)
    pos, neg = _pair(g, lambda g: {})
    heads = {"num_heads": 2, "num_head_channels": -1}  # 2 heads: head_dim 16 and 32, like SD1.5's 40/80
    return TinyModel("sd15", _build("SD15", cfg, dtype, seed, heads), torch.zeros(1, 4, 8, 8), pos, neg, (16, 32))


def tiny_sdxl(dtype=torch.float16, seed=0) -> TinyModel:
    pooled = 32
    cfg = _unet_config(64, TEXT_DIM, pooled + 6 * 256, True, transformer_depth=(0, 1))
    g = torch.Generator().manual_seed(seed + 1)
    pos, neg = _pair(g, lambda g: {"pooled_output": torch.randn(1, pooled, generator=g), "width": 64, "height": 64})
    heads = {"num_heads": -1, "num_head_channels": 64}  # SDXL's real head_dim: 2 heads at 128 channels
    return TinyModel("sdxl", _build("SDXL", cfg, dtype, seed, heads), torch.zeros(1, 4, 8, 8), pos, neg, (64,))


def tiny_sd3(dtype=torch.float16, seed=0) -> TinyModel:
    depth = 2  # MMDiT: hidden = 64 * depth, heads = depth -> head_dim 64
    cfg = dict(in_channels=16, out_channels=16, patch_size=2, depth=depth, adm_in_channels=TEXT_DIM,
               context_embedder_config={"target": "torch.nn.Linear",
                                        "params": {"in_features": TEXT_DIM, "out_features": 64 * depth}},
               pos_embed_max_size=8, num_patches=64, pos_embed_scaling_factor=None)
    g = torch.Generator().manual_seed(seed + 1)
    pos, neg = _pair(g, lambda g: {"pooled_output": torch.randn(1, TEXT_DIM, generator=g)})
    return TinyModel("sd3", _build("SD3", cfg, dtype, seed), torch.zeros(1, 16, 8, 8), pos, neg, (64,))


def tiny_lumina2(dtype=torch.bfloat16, seed=0) -> TinyModel:
    cfg = dict(image_model="lumina2", patch_size=2, in_channels=16, dim=192, n_layers=1, n_refiner_layers=1,
               n_heads=2, n_kv_heads=2, multiple_of=32, ffn_dim_multiplier=None, norm_eps=1e-5, qk_norm=True,
               cap_feat_dim=TEXT_DIM, axes_dims=[32, 32, 32], axes_lens=[300, 64, 64])
    g = torch.Generator().manual_seed(seed + 1)
    # Padded text: Lumina2 then passes masks to attention.
    pos, neg = _pair(g, lambda g: {"attention_mask": _text_mask(5)})
    return TinyModel("lumina2", _build("Lumina2", cfg, dtype, seed), torch.zeros(1, 16, 8, 8), pos, neg, (96,),
                     masks=True, cfg=1.0)


# Parameters later ComfyUI releases added to a model's params dataclass, with the value that leaves the
# feature off (0.3.75's HunyuanVideoParams: cond-type embedding, a vision-encoder input).
FEATURE_OFF = {"use_cond_type_embedding": False, "vision_in_dim": None, "byt5": False, "meanflow": False}


def _params_for(params_cls, cfg: dict) -> dict:
    """``cfg`` fitted to the installed ComfyUI's params dataclass: fields it lacks are dropped, fields it
    added are set to their 'off' value (a field with no known 'off' value fails here, by name)."""
    import dataclasses

    names = [f.name for f in dataclasses.fields(params_cls)]
    unknown = [n for n in names if n not in cfg and n not in FEATURE_OFF]
    if unknown:
        raise TypeError(f"{params_cls.__name__} has new fields {unknown}: add their 'off' values to FEATURE_OFF")
    fitted = {n: cfg.get(n, FEATURE_OFF.get(n)) for n in names}
    return {**{k: v for k, v in cfg.items() if k == "image_model"}, **fitted}


def tiny_hunyuan_video(dtype=torch.bfloat16, seed=0) -> TinyModel:
    from comfy.ldm.hunyuan_video.model import HunyuanVideoParams

    cfg = _params_for(HunyuanVideoParams, dict(
        image_model="hunyuan_video", in_channels=16, out_channels=16, vec_in_dim=TEXT_DIM, context_in_dim=TEXT_DIM,
        hidden_size=256, mlp_ratio=2.0, num_heads=2, depth=1, depth_single_blocks=1, axes_dim=[16, 56, 56],
        theta=256, patch_size=[1, 2, 2], qkv_bias=True, guidance_embed=True))
    g = torch.Generator().manual_seed(seed + 1)
    pos, neg = _pair(g, lambda g: {"pooled_output": torch.randn(1, TEXT_DIM, generator=g),
                                   "attention_mask": _text_mask(5), "guidance": 6.0})
    return TinyModel("hunyuan_video", _build("HunyuanVideo", cfg, dtype, seed), torch.zeros(1, 16, 2, 8, 8), pos, neg,
                     (128,), masks=True, cfg=1.0)


# --- The models people run now (issue 32). Each keeps the family's real head_dim; one head, one or two
# layers and 16-40 tokens keep a patched run to a few kernel calls through the Triton interpreter.

def tiny_qwen_image(dtype=torch.bfloat16, seed=0) -> TinyModel:
    """Qwen-Image: text and image tokens in one joint attention, head_dim 128."""
    cfg = dict(image_model="qwen_image", patch_size=2, in_channels=64, out_channels=16, num_layers=1,
               attention_head_dim=128, num_attention_heads=1, joint_attention_dim=TEXT_DIM, axes_dims_rope=(16, 56, 56))
    g = torch.Generator().manual_seed(seed + 1)
    pos, neg = _pair(g, lambda g: {})
    return TinyModel("qwen_image", _build("QwenImage", cfg, dtype, seed), torch.zeros(1, 16, 1, 8, 8), pos, neg, (128,),
                     cfg=1.0)


def tiny_ltxv(dtype=torch.bfloat16, seed=0) -> TinyModel:
    """LTX-Video: self-attention over video tokens, cross-attention to text with the text padding mask."""
    cfg = dict(image_model="ltxv", in_channels=16, cross_attention_dim=64, attention_head_dim=64,
               num_attention_heads=1, caption_channels=TEXT_DIM, num_layers=1)
    g = torch.Generator().manual_seed(seed + 1)
    pos, neg = _pair(g, lambda g: {"attention_mask": _text_mask(5)})
    return TinyModel("ltxv", _build("LTXV", cfg, dtype, seed), torch.zeros(1, 16, 2, 4, 4), pos, neg, (64,),
                     masks=True, cfg=1.0)


def _wan_cfg(**over) -> dict:
    cfg = dict(image_model="wan2.1", model_type="t2v", patch_size=(1, 2, 2), text_len=TEXT_TOKENS, in_dim=16,
               dim=128, ffn_dim=256, freq_dim=256, text_dim=TEXT_DIM, out_dim=16, num_heads=1, num_layers=1,
               window_size=(-1, -1), qk_norm=True, cross_attn_norm=True, eps=1e-6)
    cfg.update(over)
    return cfg


def tiny_wan22_5b(dtype=torch.bfloat16, seed=0) -> TinyModel:
    """Wan 2.2 TI2V 5B: the WAN22 model class on the 48-channel latent of the Wan 2.2 VAE."""
    g = torch.Generator().manual_seed(seed + 1)
    pos, neg = _pair(g, lambda g: {})
    return TinyModel("wan22_5b", _build("WAN22_T2V", _wan_cfg(in_dim=48, out_dim=48), dtype, seed),
                     torch.zeros(1, 48, 1, 8, 8), pos, neg, (128,), cfg=1.0)


def tiny_wan22_14b_experts(dtype=torch.float16, seed=0) -> tuple[TinyModel, TinyModel]:
    """Wan 2.2 A14B: two models of the Wan 2.1 architecture, a high-noise expert for the first steps and
    a low-noise expert for the rest (two loaders, two KSamplerAdvanced in ComfyUI's template)."""
    g = torch.Generator().manual_seed(seed + 1)
    pos, neg = _pair(g, lambda g: {})
    latent = torch.zeros(1, 16, 1, 8, 8)
    high = TinyModel("wan22_14b_high", _build("WAN21_T2V", _wan_cfg(), dtype, seed), latent, pos, neg, (128,), cfg=1.0)
    low = TinyModel("wan22_14b_low", _build("WAN21_T2V", _wan_cfg(), dtype, seed + 7), latent, pos, neg, (128,),
                    cfg=1.0)
    return high, low


def tiny_chroma(dtype=torch.bfloat16, seed=0) -> TinyModel:
    """Chroma: Flux's blocks with a distilled modulation network instead of per-block modulation."""
    # Chroma counts channels after 2x2 patching (64 for Flux's 16-channel latent).
    cfg = dict(image_model="chroma", in_channels=64, out_channels=64, context_in_dim=TEXT_DIM, hidden_size=128,
               mlp_ratio=2.0, num_heads=1, depth=1, depth_single_blocks=1, axes_dim=[16, 56, 56], theta=10000,
               patch_size=2, qkv_bias=True, in_dim=64, out_dim=128, hidden_dim=64, n_layers=1)
    g = torch.Generator().manual_seed(seed + 1)
    pos, neg = _pair(g, lambda g: {"pooled_output": None})  # Chroma's T5 encoder gives no pooled output
    return TinyModel("chroma", _build("Chroma", cfg, dtype, seed), torch.zeros(1, 16, 8, 8), pos, neg, (128,), cfg=1.0)


def tiny_flux_kontext(dtype=torch.bfloat16, seed=0) -> TinyModel:
    """Flux Kontext: a Flux model whose conditioning carries reference latents, concatenated to the image
    tokens (ReferenceLatent node), so attention sees text + image + reference tokens."""
    cfg = dict(image_model="flux", in_channels=16, out_channels=16, vec_in_dim=TEXT_DIM, context_in_dim=TEXT_DIM,
               hidden_size=128, mlp_ratio=2.0, num_heads=1, depth=1, depth_single_blocks=1, axes_dim=[16, 56, 56],
               theta=10000, patch_size=2, qkv_bias=True, guidance_embed=True)
    g = torch.Generator().manual_seed(seed + 1)
    reference = torch.randn(1, 16, 8, 8, generator=g)
    pos, neg = _pair(g, lambda g: {"pooled_output": torch.randn(1, TEXT_DIM, generator=g), "guidance": 2.5,
                                   "reference_latents": [reference]})
    return TinyModel("flux_kontext", _build("Flux", cfg, dtype, seed), torch.zeros(1, 16, 8, 8), pos, neg, (128,),
                     cfg=1.0, notes={"reference": reference})


def tiny_flux2(dtype=torch.bfloat16, seed=0) -> TinyModel:
    """Flux.2: global modulation, four RoPE axes of 32, no biases, the 128-channel latent at patch size 1."""
    cfg = dict(image_model="flux2", in_channels=128, out_channels=128, vec_in_dim=None, context_in_dim=TEXT_DIM,
               hidden_size=128, mlp_ratio=3.0, num_heads=1, depth=1, depth_single_blocks=1, axes_dim=[32, 32, 32, 32],
               theta=2000, patch_size=1, qkv_bias=False, guidance_embed=True, global_modulation=True,
               mlp_silu_act=True, ops_bias=False, default_ref_method="index", ref_index_scale=10.0)
    g = torch.Generator().manual_seed(seed + 1)
    pos, neg = _pair(g, lambda g: {"pooled_output": None, "guidance": 4.0})  # Mistral gives no pooled output
    return TinyModel("flux2", _build("Flux2", cfg, dtype, seed), torch.zeros(1, 128, 4, 4), pos, neg, (128,), cfg=1.0)


def tiny_z_image(dtype=torch.bfloat16, seed=0) -> TinyModel:
    """Z-Image: Lumina 2's blocks with Z-Image's modulation (which needs 256 channels), head_dim 128, text
    and image tokens each padded to a multiple of 32 as the released checkpoint does (its pad tokens)."""
    cfg = dict(image_model="lumina2", patch_size=2, in_channels=16, dim=256, n_layers=1, n_refiner_layers=1,
               n_heads=2, n_kv_heads=2, multiple_of=32, ffn_dim_multiplier=8.0 / 3.0, norm_eps=1e-5, qk_norm=True,
               cap_feat_dim=TEXT_DIM, axes_dims=[32, 48, 48], axes_lens=[1536, 512, 512], rope_theta=256.0,
               z_image_modulation=True, time_scale=1000.0, pad_tokens_multiple=32)
    g = torch.Generator().manual_seed(seed + 1)
    pos, neg = _pair(g, lambda g: {})
    return TinyModel("z_image", _build("ZImage", cfg, dtype, seed), torch.zeros(1, 16, 8, 8), pos, neg, (128,),
                     cfg=1.0)


def tiny_sd35(dtype=torch.float16, seed=0) -> TinyModel:
    """SD3.5 Medium's MMDiT-X: RMS q/k norm and an extra self-attention on the image tokens of a block."""
    depth = 1  # hidden = 64 * depth, heads = depth -> head_dim 64
    cfg = dict(in_channels=16, out_channels=16, patch_size=2, depth=depth, adm_in_channels=TEXT_DIM,
               context_embedder_config={"target": "torch.nn.Linear",
                                        "params": {"in_features": TEXT_DIM, "out_features": 64 * depth}},
               pos_embed_max_size=8, num_patches=64, pos_embed_scaling_factor=None, qk_norm="rms",
               x_block_self_attn=True, x_block_self_attn_layers=[0])
    g = torch.Generator().manual_seed(seed + 1)
    pos, neg = _pair(g, lambda g: {"pooled_output": torch.randn(1, TEXT_DIM, generator=g)})
    return TinyModel("sd35", _build("SD3", cfg, dtype, seed), torch.zeros(1, 16, 8, 8), pos, neg, (64,), cfg=1.0)


def tiny_aura_flow(dtype=torch.float16, seed=0) -> TinyModel:
    """AuraFlow: head_dim 256 (the kernel's widest head, run with its 64-row tile)."""
    cfg = dict(in_channels=4, out_channels=4, patch_size=2, dim=256, n_layers=1, n_double_layers=0, n_heads=1,
               global_conddim=64, cond_seq_dim=TEXT_DIM, max_seq=16)
    g = torch.Generator().manual_seed(seed + 1)
    pos, neg = _pair(g, lambda g: {})
    return TinyModel("aura_flow", _build("AuraFlow", cfg, dtype, seed), torch.zeros(1, 4, 8, 8), pos, neg, (256,),
                     cfg=1.0)


def tiny_sd15_real_heads(dtype=torch.float16, seed=0) -> TinyModel:
    """SD1.5's head sizes 40/80/160, not powers of two: 160/320/640 channels in 4 heads, as SD1.5's
    320/640/1280 in 8. One transformer per down level (self- and cross-attention), none in the middle
    and up blocks, to keep the interpreter's work small."""
    cfg = _unet_config(160, TEXT_DIM, None, False, transformer_depth=(1, 1, 1))
    cfg.update(channel_mult=[1, 2, 4], transformer_depth_middle=-2, transformer_depth_output=[0] * 6)
    g = torch.Generator().manual_seed(seed + 1)
    pos, neg = _pair(g, lambda g: {})
    heads = {"num_heads": 4, "num_head_channels": -1}
    return TinyModel("sd15_heads", _build("SD15", cfg, dtype, seed, heads), torch.zeros(1, 4, 8, 8), pos, neg,
                     (40, 80, 160), cfg=1.0)

BUILDERS: dict[str, Callable[..., TinyModel]] = {
    "flux": tiny_flux,
    "wan21": tiny_wan21,
    "sd15": tiny_sd15,
    "sdxl": tiny_sdxl,
    "sd3": tiny_sd3,
    "lumina2": tiny_lumina2,
    "hunyuan_video": tiny_hunyuan_video,
}


def sample(tiny: TinyModel, model=None, steps: int = 2, cfg: float | None = None, seed: int = 0,
           sampler: str = "euler", scheduler: str = "simple") -> torch.Tensor:
    """Sample ``model`` (default: the tiny model itself) with ``comfy.sample.sample``, from fixed noise."""
    import comfy.sample

    # prepare_noise's values from a generator of this call's own: prepare_noise seeds torch's global one, which
    # threads sampling at once (tests/test_threads.py) would share and interleave.
    noise = torch.randn(tiny.latent.size(), dtype=tiny.latent.dtype, layout=tiny.latent.layout,
                        generator=torch.Generator().manual_seed(seed), device="cpu")
    cfg = tiny.cfg if cfg is None else cfg
    return comfy.sample.sample(model if model is not None else tiny.patcher, noise, steps, cfg, sampler, scheduler,
                               tiny.positive, tiny.negative, tiny.latent, seed=seed, disable_pbar=True)


__all__ = ["BUILDERS", "TinyModel", "sample"]
