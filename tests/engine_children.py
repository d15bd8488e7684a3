"""Child processes of tests/test_engines.py: the real engines that import ``sageattention`` by name, run
by a throwaway venv's Python in which ``install.py --provide-sageattention`` put the drop-in.

    python engine_children.py yunchang | diffusers | xfuser | comfyui COMFYUI_PATH

Each prints one JSON line: per case, the cosine similarity of the engine's output (and, where the engine
returns one, the largest LSE error) against one-process attention on the full sequence in fp64.
Sequence parallelism runs over gloo on the CPU, one process per rank, kernels in the Triton interpreter.
"""
import json
import math
import os
import socket
import sys

import torch
import torch.nn.functional as F

B, S, H, D = 1, 64, 4, 32  # tiny: every rank's kernels run in the interpreter on 2 shared cores


def exact(q, k, v, causal=False, scale=None, layout="NHD"):
    """fp64 attention of (B, S, H, D) tensors (``layout="NHD"``) or (B, H, S, D); its LSE as (B, H, S)."""
    if layout == "NHD":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    q, k, v = (t.double() for t in (q, k, v))
    s = (q @ k.transpose(-1, -2)) * (scale if scale is not None else 1 / math.sqrt(q.shape[-1]))
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    out = torch.softmax(s, -1) @ v
    return (out.transpose(1, 2) if layout == "NHD" else out), torch.logsumexp(s, -1)


def cos(a, b) -> float:
    return round(F.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0).item(), 6)


def full_inputs(seed=0, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, S, H, D, generator=g).to(dtype) for _ in range(3)]


def spawn(fn, world: int, *args):
    """``fn(rank, world, port, *args)`` in ``world`` gloo processes; rank 0's return value."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_rank_main, args=(fn, r, world, port, queue, args)) for r in range(world)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=1200) for _ in range(world)]
    for p in procs:
        p.join(timeout=60)
    errors = [r for r in results if "error" in r]
    if errors:
        raise RuntimeError(errors[0]["error"])
    return next(r["value"] for r in results if r["rank"] == 0)


def _rank_main(fn, rank, world, port, queue, args):
    import traceback

    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world)
        value = fn(rank, world, *args)
        queue.put({"rank": rank, "value": value})
    except BaseException:  # noqa: BLE001 - reported to the parent, which fails the test with it
        queue.put({"rank": rank, "error": f"rank {rank}: {traceback.format_exc()}"})
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


# ---- yunchang: LongContextAttention (Ulysses, ring, USP) with every SAGE attention type

YUNCHANG_LAYOUTS = {"ulysses2": (2, 1), "ring2": (1, 2), "ring4": (1, 4), "usp2x2": (2, 2)}  # (ulysses, ring)


def _yunchang_rank(rank, world, layouts, types):
    import torch.distributed as dist
    from yunchang import LongContextAttention, set_seq_parallel_pg
    from yunchang.globals import HAS_SAGE_ATTENTION
    from yunchang.kernels import AttnType

    assert HAS_SAGE_ATTENTION, "yunchang did not find the sageattention drop-in"
    q, k, v = full_inputs()
    out = {}
    for name in layouts:
        ulysses, ring = YUNCHANG_LAYOUTS[name]
        sp = ulysses * ring
        set_seq_parallel_pg(ulysses, ring, rank, world)  # world / sp data-parallel copies of the same call
        sp_rank = rank % sp
        local = [t.chunk(sp, dim=1)[sp_rank].contiguous() for t in (q, k, v)]
        for type_name in types:
            for causal in (False, True):
                attn = LongContextAttention(ring_impl_type="basic", attn_type=AttnType[type_name])
                got = attn(*local, softmax_scale=None, causal=causal)
                ref = exact(q, k, v, causal)[0].chunk(sp, dim=1)[sp_rank]
                out[f"{name} {type_name}{' causal' if causal else ''}"] = cos(got, ref)
    gathered = [None] * world
    dist.all_gather_object(gathered, out)
    return {key: min(g[key] for g in gathered) for key in out}


def yunchang():
    types = ["SAGE_AUTO", "SAGE_FP16", "SAGE_FP16_TRITON", "SAGE_FP8", "SAGE_FP8_SM90"]
    return spawn(_yunchang_rank, 4, list(YUNCHANG_LAYOUTS), types)


# ---- diffusers: the attention dispatcher's sage backend, alone and with context parallelism

def _diffusers_rank(rank, world, modes):
    import torch.distributed as dist
    from diffusers.models._modeling_parallel import ContextParallelConfig, ParallelConfig
    from diffusers.models.attention_dispatch import dispatch_attention_fn
    from torch.distributed.device_mesh import init_device_mesh

    q, k, v = full_inputs(1)
    out = {}
    for mode in modes:
        ring, ulysses = (world, 1) if mode == "ring" else (1, world)
        mesh = init_device_mesh("cpu", (ring, ulysses), mesh_dim_names=("ring", "ulysses"))
        config = ParallelConfig(context_parallel_config=ContextParallelConfig(ring_degree=ring, ulysses_degree=ulysses))
        config.setup(rank, world, torch.device("cpu"), mesh=mesh)
        local = [t.chunk(world, dim=1)[rank].contiguous() for t in (q, k, v)]
        # diffusers 0.42 refuses causal attention with context parallelism; a scale is passed through.
        got = dispatch_attention_fn(*local, scale=0.2, backend="sage", parallel_config=config)
        out[mode] = cos(got, exact(q, k, v, scale=0.2)[0].chunk(world, dim=1)[rank])
    gathered = [None] * world
    dist.all_gather_object(gathered, out)
    return {key: min(g[key] for g in gathered) for key in out}


def diffusers():
    from diffusers.models import attention_dispatch as ad

    assert ad._CAN_USE_SAGE_ATTN, "diffusers did not accept the sageattention drop-in"
    q, k, v = full_inputs(1)
    out = {}
    for causal in (False, True):
        got = ad.dispatch_attention_fn(q, k, v, is_causal=causal, scale=0.2, backend="sage")
        out[f"one process{' causal' if causal else ''}"] = cos(got, exact(q, k, v, causal, 0.2)[0])
    got, lse = ad.dispatch_attention_fn(q, k, v, backend="sage", attention_kwargs={"return_lse": True})
    ref, ref_lse = exact(q, k, v)
    out["one process, lse"] = cos(got, ref)
    out["lse max error"] = round((lse.double() - ref_lse).abs().max().item(), 6)
    out.update(spawn(_diffusers_rank, 2, ["ulysses", "ring"]))
    return out


# ---- xfuser (xDiT): its SAGE attention backend's call

def xfuser():
    from xfuser.core.distributed import attention_backend as ab

    assert ab.env_info["has_sage"], "xfuser did not find the sageattention drop-in"
    call = ab.ATTENTION_FUNCTION_REGISTRY[ab.AttentionBackendType.SAGE]
    q, k, v = (t.transpose(1, 2).contiguous() for t in full_inputs(2))  # xfuser hands (B, H, S, D)
    out = {}
    for causal in (False, True):
        got, lse = call(q, k, v, dropout_p=0.0, is_causal=causal)
        ref, ref_lse = exact(q, k, v, causal, layout="HND")
        out[f"sage{' causal' if causal else ''}"] = cos(got, ref)
        out[f"lse max error{' causal' if causal else ''}"] = round((lse.double() - ref_lse).abs().max().item(), 6)
    return out


# ---- ComfyUI core: attention_sage (what --use-sage-attention runs) through the drop-in

def comfyui(path):
    sys.path.insert(0, path)
    sys.argv = [sys.argv[0], "--cpu"]
    import comfy.cli_args

    comfy.cli_args.args.cpu = True
    from comfy.ldm.modules import attention as ca

    assert ca.SAGE_ATTENTION_IS_AVAILABLE, "ComfyUI did not import the sageattention drop-in"
    q, k, v = full_inputs(3)
    heads = H
    flat = [t.reshape(B, S, H * D) for t in (q, k, v)]  # ComfyUI's (B, L, H·D)
    mask = torch.zeros(B, S, S)
    mask[..., S // 2:] = -1e4  # a padding-like additive mask: SageAttention 2.2 would ignore it
    import logging

    errors = []  # attention_sage logs and falls back to SDPA when sageattn raises: that must not pass here

    class Count(logging.Handler):
        def emit(self, record):
            if record.levelno >= logging.ERROR:
                errors.append(record.getMessage())

    logging.getLogger().addHandler(Count())
    out = {}
    for name, kw, ref_mask in (("plain", {}, None), ("mask", {"mask": mask}, mask)):
        got = ca.attention_sage(*flat, heads, **kw)
        ref = F.scaled_dot_product_attention(*(t.transpose(1, 2).float() for t in (q, k, v)),
                                             attn_mask=ref_mask[:, None] if ref_mask is not None else None)
        out[name] = cos(got, ref.transpose(1, 2).reshape(B, S, H * D))
    # skip_reshape: (B, H, L, D) in and out, as Wan and Flux call it
    hnd = [t.transpose(1, 2) for t in (q, k, v)]
    got = ca.attention_sage(*hnd, heads, skip_reshape=True, skip_output_reshape=True)
    out["skip_reshape"] = cos(got, exact(*hnd, layout="HND")[0])
    out["errors logged"] = errors
    return out


if __name__ == "__main__":
    which = sys.argv[1]
    result = {"yunchang": yunchang, "diffusers": diffusers, "xfuser": xfuser}.get(which)
    value = result() if result else comfyui(sys.argv[2])
    print("RESULT " + json.dumps(value))
