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


def tiny_hunyuan_video(dtype=torch.bfloat16, seed=0) -> TinyModel:
    cfg = dict(image_model="hunyuan_video", in_channels=16, out_channels=16, vec_in_dim=TEXT_DIM,
               context_in_dim=TEXT_DIM, hidden_size=256, mlp_ratio=2.0, num_heads=2, depth=1, depth_single_blocks=1,
               axes_dim=[16, 56, 56], theta=256, patch_size=[1, 2, 2], qkv_bias=True, guidance_embed=True,
               byt5=False, meanflow=False)
    g = torch.Generator().manual_seed(seed + 1)
    pos, neg = _pair(g, lambda g: {"pooled_output": torch.randn(1, TEXT_DIM, generator=g),
                                   "attention_mask": _text_mask(5), "guidance": 6.0})
    return TinyModel("hunyuan_video", _build("HunyuanVideo", cfg, dtype, seed), torch.zeros(1, 16, 2, 8, 8), pos, neg,
                     (128,), masks=True, cfg=1.0)


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

    noise = comfy.sample.prepare_noise(tiny.latent, seed)
    cfg = tiny.cfg if cfg is None else cfg
    return comfy.sample.sample(model if model is not None else tiny.patcher, noise, steps, cfg, sampler, scheduler,
                               tiny.positive, tiny.negative, tiny.latent, seed=seed, disable_pbar=True)


__all__ = ["BUILDERS", "TinyModel", "sample"]
