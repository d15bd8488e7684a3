"""Two GPUs (issue 53): the kernels across devices, inside sequence parallelism, one thread per GPU.

    python bench/two_gpu.py [--part guard|sp|threads] [--out bench/results/sm90x2_two_gpu.json]
    python bench/two_gpu.py --cpu-smoke     # the sp and threads parts on the CPU (gloo, interpreter, tiny)

guard    q/k/v (masks, RoPE tables) on cuda:1 while cuda:0 is current, and the reverse, through sageattn
         (plain, masks, LSE, Hopper's long-sequence kernel), every drop-in name, sparse attention where the
         tree has it, the RoPE kernel and a replayed call: bit-equal to the same call with its own device
         current; the profiler's kernels all on the inputs' device; and on that device's current stream
         (its inputs are written on a side stream behind a sleep: a launch elsewhere reads them unwritten).
sp       yunchang's LongContextAttention over NCCL, Ulysses 2 and ring 2, every SAGE type through the
         drop-in, at 75,600 x 24 and 103,950 x 56 heads (head_dim 128, bf16): cosine against the same
         function on the full sequence on one GPU, and the time of one call against that one GPU's.
threads  two threads, each with its own current device, each running a Wan 2.1 1.3B self-attention block
         (dim 1536, 12 heads, 32,760 tokens: 480x832, 81 frames) with the RoPE kernel for a few steps at
         once: outputs equal to each device's run alone, no kernel turned off, replays kept per thread.

NVLink multicast stays off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1,
set here for this process and every child). yunchang is imported from an installed copy or from its
wheel in .ref/wheels/ (a pure-Python wheel imports as it is); the drop-in is written by
``installer.dropin.install`` into a temporary folder put on the path (never into the Python's own site).
"""
from __future__ import annotations

import argparse
import atexit
import glob
import json
import math
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

for _name in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS"):
    os.environ[_name] = "0" if _name == "NCCL_NVLS_ENABLE" else "1"
ROOT = Path(__file__).resolve().parent.parent
_WHEELS = sorted(glob.glob(str(ROOT / ".ref" / "wheels" / "yunchang-*.whl")))
if _WHEELS:
    sys.path.append(_WHEELS[-1])
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), _WHEELS[-1]) if p)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from common import RESULTS, cosine, environment, import_pack, write_json  # noqa: E402

import_pack()
from sagetriton.installer import dropin  # noqa: E402
from sagetriton.kernels import api, failures, replay, rope, sageattention_compat  # noqa: E402

SP_SHAPES = [(75600, 24), (103950, 56)]  # (tokens, heads), head_dim 128
SAGE_TYPES = ["SAGE_AUTO", "SAGE_FP16", "SAGE_FP16_TRITON", "SAGE_FP8", "SAGE_FP8_SM90"]
# The function each type runs, as yunchang calls it (for the one-GPU reference).
TYPE_CALLS = {"SAGE_AUTO": ("sageattn", {}),
              "SAGE_FP16": ("sageattn_qk_int8_pv_fp16_cuda", {"pv_accum_dtype": "fp32"}),
              "SAGE_FP16_TRITON": ("sageattn_qk_int8_pv_fp16_triton", {}),
              "SAGE_FP8": ("sageattn_qk_int8_pv_fp8_cuda", {"pv_accum_dtype": "fp32+fp32"}),
              "SAGE_FP8_SM90": ("sageattn_qk_int8_pv_fp8_cuda_sm90", {"pv_accum_dtype": "fp32+fp32"})}
SP_MIN_COS = 0.9995
WAN = dict(dim=1536, heads=12, tokens=32760, steps=4)


def provide_dropin() -> str:
    """The drop-in in a temporary folder on this process's and its children's path, as install.py writes it."""
    try:
        import sageattention

        if not hasattr(sageattention, "PACK_DIR"):
            print(f"note: a real sageattention is importable ({sageattention.__file__}): yunchang would use it; "
                  "the drop-in goes first on the path for this run")
    except ImportError:
        pass
    target = tempfile.mkdtemp(prefix="sagetriton-dropin-")
    atexit.register(shutil.rmtree, target, True)
    ok, message = dropin.install(Path(target), check_others=False)  # this run's own path, in front of any other
    if not ok:
        sys.exit(message)
    sys.path.insert(0, target)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (target, os.environ.get("PYTHONPATH")) if p)
    sys.modules.pop("sageattention", None)
    return target


# ---- part 1: the device guard ------------------------------------------------------------------

def _launch_devices(fn):
    """(result, CUDA device indices the profiler saw kernels on) of ``fn()``."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        out = fn()
        for i in range(torch.cuda.device_count()):
            torch.cuda.synchronize(i)
    devices = {e.device_index for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA}
    return out, devices


def _guard_cases(dev: torch.device) -> list:
    """(name, inputs, fn) where fn(*inputs) returns a tensor or a tuple of tensors."""
    g = torch.Generator(device=dev).manual_seed(1)

    def rnd(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, generator=g, device=dev).to(dtype)

    q, k, v = rnd(2, 8, 1024, 128), rnd(2, 8, 1024, 128), rnd(2, 8, 1024, 128)
    long_q = [rnd(1, 8, 8192, 128) for _ in range(3)]
    nhd = [t.transpose(1, 2).contiguous() for t in (q, k, v)]
    cases = [
        ("sageattn", (q, k, v), lambda *t: sageattention_compat.sageattn(*t)),
        ("sageattn, bool mask", (q, k, v, torch.rand(1, 1, 1024, 1024, generator=g, device=dev) > 0.2),
         lambda q, k, v, m: api.sageattn(q, k, v, attn_mask=m)),
        ("sageattn, additive mask", (q, k, v, rnd(2, 1, 1024, 1024)),
         lambda q, k, v, m: api.sageattn(q, k, v, attn_mask=m)),
        ("sageattn, LSE", (q, k, v), lambda *t: api.sageattn(*t, return_lse=True)),
        ("sageattn, 8K (Hopper's long-sequence kernel), LSE", long_q, lambda *t: api.sageattn(*t, return_lse=True)),
    ]
    for name, kw in TYPE_CALLS.values():
        fn = getattr(sageattention_compat, name)
        cases.append((f"drop-in {name}, NHD, LSE", nhd,
                      lambda *t, fn=fn, kw=kw: fn(*t, tensor_layout="NHD", return_lse=True, causal=False, **kw)))
    cu = torch.tensor([0, 700, 2048], dtype=torch.int32, device=dev)
    cases.append(("drop-in sageattn_varlen", [t.reshape(2048, 8, 128) for t in nhd],
                  lambda q, k, v: sageattention_compat.sageattn_varlen(q, k, v, cu, cu, 1348, 1348)))
    x, freqs = rnd(1, 24, 4096, 128), torch.randn(1, 1, 4096, 64, 2, 2, generator=g, device=dev)
    cases.append(("RoPE kernel, q and k", (x, freqs, x * 0.5), lambda x, f, y: rope.apply(x, f, y)))
    sparse = getattr(__import__("sagetriton.kernels", fromlist=["x"]), "sparse_attn", None)
    if sparse is not None:
        cases.append(("sparse_attn", (q, k, v), lambda *t: sparse(*t)))
    else:
        print("-- sparse_attn: not in this tree (skipped)")
    return cases


def _flat(out) -> list:
    return [t.cpu() for t in (out if isinstance(out, tuple) else (out,))]


def guard_part() -> list:
    rows = []
    for current, target in ((0, 1), (1, 0)):
        torch.cuda.set_device(target)
        dev = torch.device("cuda", target)
        for name, inputs, fn in _guard_cases(dev):
            expected = _flat(fn(*inputs))  # with the inputs' own device current
            replay.clear()  # the first call below works its launches out with the other device current
            for attempt in ("first", "replayed"):  # the second call of a shape replays the first's launches
                torch.cuda.set_device(current)
                out, devices = _launch_devices(lambda fn=fn, inputs=inputs: fn(*inputs))
                ok = all(torch.equal(a, b) for a, b in zip(_flat(out), expected, strict=True)) and devices == {target}
                rows.append({"case": name, "call": attempt, "current": current, "inputs_on": target, "ok": ok,
                             "kernel_devices": sorted(devices)})
                print(f"{'ok ' if ok else 'BAD'} {name + ' (' + attempt + ')':58s} current cuda:{current}, inputs "
                      f"cuda:{target}: same bits={ok}, kernels on {sorted(devices)}", flush=True)
        rows.append(_stream_case(current, target))
    return rows


def _stream_case(current: int, target: int) -> dict:
    """Kernels on the inputs' device's *current* stream: a side stream there holds a sleep and then writes
    the inputs; a launch on any other stream would read them before they are written."""
    torch.cuda.set_device(target)
    dev = torch.device("cuda", target)
    src = [torch.randn(1, 8, 2048, 128, device=dev, dtype=torch.bfloat16) for _ in range(3)]
    expected = api.sageattn(*src).cpu()
    side = torch.cuda.Stream(device=dev)
    with torch.cuda.stream(side):
        dst = [torch.zeros_like(t) for t in src]
    torch.cuda.synchronize(target)
    torch.cuda.set_stream(side)  # side becomes cuda:<target>'s current stream (and that device current)
    torch.cuda.set_device(current)
    with torch.cuda.device(target):
        torch.cuda._sleep(int(2e8))  # ~0.1 s on the side stream
        for d, s in zip(dst, src, strict=True):
            d.copy_(s)
    out = api.sageattn(*dst)  # cuda:<current> current; the guard makes cuda:<target> and its side stream current
    side.synchronize()
    ok = torch.equal(out.cpu(), expected)
    with torch.cuda.device(target):
        torch.cuda.set_stream(torch.cuda.default_stream(dev))
    torch.cuda.set_device(current)
    print(f"{'ok ' if ok else 'BAD'} {'stream: the inputs device current stream':58s} current cuda:{current}, "
          f"inputs cuda:{target}: same bits={ok}", flush=True)
    return {"case": "current stream of the inputs' device", "current": current, "inputs_on": target, "ok": ok}


# ---- part 2: sequence parallelism (yunchang over NCCL) -------------------------------------------

def _spawn(fn, world: int, *args):
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(fn, r, world, port, queue, args)) for r in range(world)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=3000) for _ in range(world)]
    for p in procs:
        p.join(timeout=120)
    bad = [r["error"] for r in results if "error" in r]
    if bad:
        raise RuntimeError(bad[0])
    return next(r["value"] for r in results if r["rank"] == 0)


def _rank(fn, rank, world, port, queue, args):
    import traceback

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(rank)
        else:
            torch.set_num_threads(1)
        dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
        queue.put({"rank": rank, "value": fn(rank, world, *args)})
    except BaseException:  # noqa: BLE001 - handed to the parent
        queue.put({"rank": rank, "error": f"rank {rank}: {traceback.format_exc()}"})
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _sp_rank(rank, world, shapes, head_dim, repeats, min_cos):
    import sageattention
    import torch.distributed as dist
    from yunchang import LongContextAttention, set_seq_parallel_pg
    from yunchang.globals import HAS_SAGE_ATTENTION
    from yunchang.kernels import AttnType

    assert HAS_SAGE_ATTENTION and hasattr(sageattention, "PACK_DIR"), "yunchang must run the drop-in"
    dev = torch.device("cuda", rank) if torch.cuda.is_available() else torch.device("cpu")
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    rows = []
    for tokens, heads in shapes:
        g = torch.Generator(device=dev).manual_seed(tokens)
        full = [torch.randn(1, tokens, heads, head_dim, generator=g, device=dev).to(torch.bfloat16) for _ in range(3)]
        local = [t.chunk(world, dim=1)[rank].contiguous() for t in full]
        for mode, (ulysses, ring) in (("ulysses 2", (world, 1)), ("ring 2", (1, world))):
            set_seq_parallel_pg(ulysses, ring, rank, world)
            for type_name in SAGE_TYPES:
                attn = LongContextAttention(ring_impl_type="basic", attn_type=AttnType[type_name])
                times = []
                for _ in range(repeats + 1):  # the first call builds and records
                    dist.barrier()
                    sync()
                    t0 = time.perf_counter()
                    out = attn(*local)
                    sync()
                    dist.barrier()
                    times.append(time.perf_counter() - t0)
                parts = [torch.empty_like(out) for _ in range(world)]
                dist.all_gather(parts, out.contiguous())
                row = {"tokens": tokens, "heads": heads, "mode": mode, "type": type_name,
                       "ms": round(1e3 * sorted(times[1:])[len(times[1:]) // 2], 3)}
                if rank == 0:
                    name, kw = TYPE_CALLS[type_name]
                    fn = getattr(sageattention, name)
                    one_times = []
                    for _ in range(repeats + 1):
                        sync()
                        t0 = time.perf_counter()
                        ref = fn(*full, tensor_layout="NHD", **kw)
                        sync()
                        one_times.append(time.perf_counter() - t0)
                    row["one_gpu_ms"] = round(1e3 * sorted(one_times[1:])[len(one_times[1:]) // 2], 3)
                    row["cos"] = round(cosine(torch.cat(parts, dim=1), ref), 6)
                    row["ok"] = row["cos"] >= min_cos
                    print(f"{'ok ' if row['ok'] else 'BAD'} {mode} {type_name:17s} {tokens} x {heads}: cos "
                          f"{row['cos']:.6f}, {row['ms']:.1f} ms on {world} GPUs, one GPU {row['one_gpu_ms']:.1f} ms",
                          flush=True)
                    del ref
                rows.append(row)
                del parts, out
        del full, local
    return rows


def sp_part(shapes=SP_SHAPES, head_dim=128, repeats=3, min_cos=SP_MIN_COS) -> list:
    provide_dropin()
    return _spawn(_sp_rank, 2, shapes, head_dim, repeats, min_cos)


# ---- part 3: one thread per GPU ------------------------------------------------------------------

def _wan_block(dev, dim, heads, tokens, steps, seed=0):
    """A Wan 2.1 1.3B self-attention block's forward, ``steps`` times: q/k/v projections, RMS norm of q and k,
    RoPE (the pack's kernel), the kernel's attention, the output projection. Returns the last output."""
    g = torch.Generator(device=dev).manual_seed(seed)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float16
    w = [torch.randn(dim, dim, generator=g, device=dev).to(dtype) / math.sqrt(dim) for _ in range(4)]
    x = torch.randn(1, tokens, dim, generator=g, device=dev).to(dtype)
    angles = torch.randn(1, 1, tokens, dim // heads // 2, generator=g, device=dev)
    freqs = torch.stack([angles.cos(), -angles.sin(), angles.sin(), angles.cos()], -1).unflatten(-1, (2, 2))
    for _ in range(steps):
        q, k, v = (F.linear(x, wi).unflatten(-1, (heads, dim // heads)) for wi in w[:3])  # (B, L, H, D)
        q, k = (F.rms_norm(t, (t.shape[-1],)) for t in (q, k))
        q, k = rope.apply(q.transpose(1, 2), freqs, k.transpose(1, 2))  # RoPE on (B, H, L, D)
        o = api.sageattn(q, k, v.transpose(1, 2), out_layout="NHD")
        x = x + F.linear(o.flatten(-2), w[3])
    return x


def threads_part(devices=None, shape=WAN, serialize=None) -> list:
    devices = devices or [torch.device("cuda", i) for i in range(2)]
    alone = []
    for dev in devices:
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        alone.append(_wan_block(dev, **shape).cpu())
    replay.clear()
    results, errors = {}, []
    start = threading.Barrier(len(devices))

    def work(i, dev):
        try:
            if dev.type == "cuda":
                torch.cuda.set_device(dev)  # this thread's current device, as a work unit sets it
            start.wait()
            results[i] = _wan_block(dev, **shape).cpu()
        except BaseException as e:  # noqa: BLE001
            errors.append(f"thread {i}: {type(e).__name__}: {e}")

    t0 = time.perf_counter()
    threads = [threading.Thread(target=work, args=(i, d)) for i, d in enumerate(devices)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    keys = {key[-1] for key in failures.memory.replays}
    rows = []
    for i, dev in enumerate(devices):
        ok = not errors and i in results and torch.equal(results[i], alone[i])
        rows.append({"thread": i, "device": str(dev), "same_as_alone": ok})
        print(f"{'ok ' if ok else 'BAD'} {'thread ' + str(i) + ' on ' + str(dev):58s} output = its device's run "
              f"alone: {ok}", flush=True)
    same_across = len(results) == 2 and torch.equal(results[0], results[1])
    healthy = api.shared_kv_error() is None and not errors
    rows.append({"threads_seconds": round(seconds, 2), "errors": errors, "gluon_error": api.shared_kv_error(),
                 "recording_threads": len(keys), "same_bits_across_devices": same_across, "ok": healthy})
    print(f"{'ok ' if healthy else 'BAD'} {'both threads at once':58s} {seconds:.1f} s, errors {errors or 'none'}, "
          f"Gluon kernel error {api.shared_kv_error()}, replays kept by {len(keys)} threads, "
          f"same bits on both devices: {same_across}", flush=True)
    return rows


def cpu_smoke() -> dict:
    """The sp and threads parts on the CPU: gloo ranks, the Triton interpreter, tiny shapes."""
    from triton.runtime.interpreter import InterpretedFunction

    # Ring steps round P to fp8 against each shard's own row max: at 64 random tokens that alone moves fp8's
    # cosine to ~0.9993 against the one-process call (the GPU part's 0.9995 is for real lengths).
    sp = sp_part(shapes=[(64, 4)], head_dim=32, repeats=1, min_cos=0.999)
    run, lock = InterpretedFunction.run, threading.Lock()

    def one_at_a_time(self, *a, **kw):  # the interpreter is not thread-safe; the GPU part has no lock
        with lock:
            return run(self, *a, **kw)

    InterpretedFunction.run = one_at_a_time
    replay.DEVICE_TYPES = ("cuda", "cpu")
    try:
        threads = threads_part([torch.device("cpu")] * 2, dict(dim=64, heads=2, tokens=48, steps=2))
    finally:
        InterpretedFunction.run = run
    return {"sp": sp, "threads": threads}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=("guard", "sp", "threads"), help="run only this part")
    ap.add_argument("--cpu-smoke", action="store_true", help="sp and threads on the CPU, tiny (no GPU needed)")
    ap.add_argument("--out", type=Path, help="JSON results (default bench/results/sm90x2_two_gpu.json)")
    args = ap.parse_args(argv)
    if args.cpu_smoke:
        if os.environ.get("TRITON_INTERPRET") != "1":
            sys.exit("--cpu-smoke: run with TRITON_INTERPRET=1 (set before Triton is imported)")
        result = cpu_smoke()
        print("RESULT " + json.dumps(result))
        ok = all(r.get("ok", True) for r in result["sp"]) and all(
            r.get("ok", r.get("same_as_alone", True)) for r in result["threads"])
        return 0 if ok else 1
    if torch.cuda.device_count() < 2:
        sys.exit(f"two_gpu.py needs 2 GPUs, found {torch.cuda.device_count()}")
    env = {**environment(), "gpus": [torch.cuda.get_device_name(i) for i in range(2)]}
    print(env)
    out = {}
    for name, part in (("guard", guard_part), ("sp", sp_part), ("threads", threads_part)):
        if args.part in (None, name):
            out[name] = part()
    rows = [r for part in out.values() for r in part]
    bad = [r for r in rows if r.get("ok") is False or r.get("same_as_alone") is False]
    print(f"two_gpu: {len(rows) - len(bad)} passed, {len(bad)} failed")
    write_json(args.out or RESULTS / "sm90x2_two_gpu.json", {**env, **out})
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
