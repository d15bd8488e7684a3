"""Issue 40 item 1: training through a patched model. Calls that need gradients go to ComfyUI's attention
(which has them), counted with their reason; the kernel has no backward."""
import pytest


def _train(model, tiny, steps=2, checkpointing=False):
    import torch
    from comfy_extras.nodes_train import TrainLoraNode

    latents = {"samples": torch.randn(tiny.latent.shape, generator=torch.Generator().manual_seed(0))}
    inputs = dict(model=model, latents=latents, positive=tiny.positive, batch_size=1, steps=steps,
                  grad_accumulation_steps=1, learning_rate=1e-3, rank=2, optimizer="AdamW", loss_function="MSE",
                  seed=0, training_dtype="bf16", lora_dtype="bf16", algorithm="LoRA",
                  gradient_checkpointing=checkpointing, existing_lora="[None]")
    if hasattr(TrainLoraNode, "train"):  # ComfyUI 0.3.64: a classic node
        return TrainLoraNode().train(**inputs)
    # A V3 node from 0.3.75 on: every input arrives as a list (is_input_list), the outputs in a NodeOutput.
    # Two latents: 0.3.75's node leaves `multi_res` unset when given exactly one.
    listed = {name: [value] for name, value in inputs.items()}
    listed["latents"] = [latents, {"samples": latents["samples"].clone()}]
    return TrainLoraNode.execute(**listed).args


@pytest.mark.parametrize("checkpointing", [False, True])
def test_comfyui_lora_training_through_a_patched_model(rep, comfyui_path, checkpointing):
    """ComfyUI's own TrainLoraNode on a tiny bf16 Wan 2.1: unpatched it trains; patched it must too."""
    import torch
    from sagetriton.nodes.patching import patch_state_of
    from sagetriton.nodes.reporting import stats
    from sagetriton.nodes.routing.dispatch import NEEDS_GRAD
    from sagetriton.nodes.ui.patch_node import SageTritonPatchModelAttention
    from tiny_models import BUILDERS, sample

    tiny = BUILDERS["wan21"](dtype=torch.bfloat16, seed=0)
    (patched,) = SageTritonPatchModelAttention().patch(tiny.patcher)
    assert patch_state_of(patched) is not None
    start = stats.attention_stats()
    with torch.inference_mode():  # as ComfyUI runs every node
        _model, lora, loss, steps = _train(patched, tiny, checkpointing=checkpointing)
    losses = loss["loss"] if isinstance(loss, dict) else loss
    assert steps == 2 and all(torch.isfinite(torch.as_tensor(v)).all() for v in losses), loss
    assert lora and all(torch.isfinite(w).all() for w in lora.values())
    # Every training call went to ComfyUI's attention, counted under its own reason.
    trained = stats.attention_stats()
    assert trained["kernel"] == start["kernel"], trained
    assert trained["fallback"].get(NEEDS_GRAD, 0) > start["fallback"].get(NEEDS_GRAD, 0), trained
    # Inference through the same patched model still reaches the kernel.
    with torch.inference_mode():
        out = sample(tiny, patched, steps=1)
    assert torch.isfinite(out).all() and stats.attention_stats()["kernel"] > trained["kernel"]
