"""The non-Hopper default configs, cross-compiled at head_dim 128 with the installed Triton, keep
their registers: no VGPR spills (AMD) and no local-memory spill traffic (NVIDIA).

The launch is specialized the way Triton's runtime does it (16-byte divisibility, integer
arguments equal to 1 as constants). Without that (``compile_specs``' plain signatures) the
compiler cannot vectorize the unit-stride V loads and the same kernel spills on gfx1201, so the
plain path would measure a kernel that never runs.
"""
import json
import os
import subprocess
import sys

from pack_loader import PACK_DIR

TARGETS = ("sm80", "sm86", "sm89", "sm120", "gfx1100", "gfx1201", "gfx942")

# Runs in a child: Triton's interpreter (TRITON_INTERPRET=1 in the test process) replaces @jit.
_CHILD = r"""
import json, os, re, subprocess, sys, tempfile
sys.path.insert(0, sys.argv[1])
from pack_loader import import_pack
import_pack()
import torch, triton
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import create_function_from_signature
from sagetriton.kernels import api, crosscompile
from sagetriton.kernels.arch import default_config

nv_bin = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
out = {}
for name in sys.argv[2].split(","):
    t = crosscompile.parse_target(name)
    cfg = default_config(t.arch_info(), 128)
    seen = []
    real = api._launch
    api._launch = lambda kernel, grid, args, cx, num_warps, num_stages=1, **o: seen.append(
        (kernel, args, cx, dict(num_warps=num_warps, num_stages=num_stages, **o)))
    try:
        q = torch.empty((1, 2, 4096, 128), dtype=torch.bfloat16, device="meta")
        api.attention_forward(q, q, q, "HND", False, None, None, False, cfg, True, False)
    finally:
        api._launch = real
    kernel, args, cx, opts = next(s for s in seen if s[0].fn.__name__ == "attention_kernel")
    backend = make_backend(t.gpu_target())
    bind = create_function_from_signature(kernel.signature, kernel.params, backend)
    kw = dict(zip([n for n in kernel.arg_names if n not in cx], args), **cx)
    bound, spec, _ = bind(**kw)
    _, sig, consts, attrs = kernel._pack_args(backend, {}, bound, spec, {})
    c = triton.compile(ASTSource(kernel, sig, consts, attrs), target=t.gpu_target(), options=opts)
    r = {"config": cfg.as_dict(), "shared": c.metadata.shared}
    if t.backend == "cuda":
        with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
            f.write(c.asm["cubin"])
        try:
            use = subprocess.run([os.path.join(nv_bin, "cuobjdump"), "--dump-resource-usage", f.name],
                                 capture_output=True, text=True, check=True).stdout
            sass = subprocess.run([os.path.join(nv_bin, "nvdisasm"), "-c", f.name],
                                  capture_output=True, text=True, check=True).stdout
        finally:
            os.unlink(f.name)
        r["regs"] = int(re.search(r"REG:(\d+)", use).group(1))
        r["stack"] = int(re.search(r"STACK:(\d+)", use).group(1))
        r["spill_ops"] = len(re.findall(r"\b(?:STL|LDL)\b", sass))
    else:
        asm = c.asm["amdgcn"]
        r["regs"] = int(re.search(r"\.vgpr_count:\s+(\d+)", asm).group(1))
        r["spill_ops"] = int(re.search(r"\.vgpr_spill_count:\s+(\d+)", asm).group(1))
        r["stack"] = int(re.search(r"\.private_segment_fixed_size:\s+(\d+)", asm).group(1))
    out[name] = r
print(json.dumps(out))
"""

# Shared memory per block each family can give (bytes): sm89 / sm86 / sm120 99 KB, sm80 163 KB,
# AMD 64 KB LDS per workgroup.
SHARED_LIMIT = {"sm80": 163 * 1024, "sm86": 99 * 1024, "sm89": 99 * 1024, "sm120": 99 * 1024,
                "gfx1100": 64 * 1024, "gfx1201": 64 * 1024, "gfx942": 64 * 1024}


def _compile(targets):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(PACK_DIR / "tests"), ",".join(targets)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=str(PACK_DIR))
    return proc


def test_default_configs_compile_without_register_spills():
    # NVIDIA and AMD in two children: two cores, about half the cold time.
    procs = [_compile([t for t in TARGETS if t.startswith(p)]) for p in ("sm", "gfx")]
    results = {}
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, stderr[-3000:]
        results.update(json.loads(stdout.strip().splitlines()[-1]))
    assert set(results) == set(TARGETS)
    for name, r in results.items():
        assert r["spill_ops"] == 0 and r["stack"] == 0, (name, r)
        assert 0 < r["regs"] <= (512 if name == "gfx942" else 256), (name, r)
        assert r["shared"] <= SHARED_LIMIT[name], (name, r)
