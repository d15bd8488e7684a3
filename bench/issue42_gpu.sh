#!/usr/bin/env bash
# Issue 42 on one GPU, one call of ~6 minutes on an H200 (at most 8m45 by the timeouts). From the
# repository root, with ComfyUI 0.3.64 carried as .comfyui (git-ignored: cp -r ~/ComfyUI .comfyui,
# then run with carry [".comfyui", ".whl"], .whl holding the torchsde and trampoline wheels):
#
#   bash bench/issue42_gpu.sh            # results under $OUT (the device's output folder) or bench/results
#   bash bench/issue42_gpu.sh flux-profile   # only: Flux's forward by kind of kernel, unpatched and patched,
#                                            # then 11 interleaved runs with the controls (~4 minutes)
#   bash bench/issue42_gpu.sh rope   # the RoPE kernel: gpu_check's rope part, alone against ComfyUI's and
#                                    # comfy-kitchen's (carry .ck too: comfy_kitchen/ as .tar.xz, no HIP
#                                    # library), Flux and Wan with and without it (~6 minutes)
#
# 1. rotation_cost_ab.py: no rotation / the portable "dot" rotation / Hopper's "tiled" one / SDPA at
#    8K, 16K, 32K x 128, each quantization launch alone, and accuracy on bench/accuracy_cases.py.
# 2. pass_on_cost.py: the override's own host cost per passed-on call, dispatcher vs forward plan.
# 3. bench_models.py --controls: SDXL and SD1.5 (every call short: forwards passed through whole),
#    41 interleaved runs; Flux with the defaults and without the rotation, 15 runs.
set -u
source bench/device_env.sh
if [ "${1:-}" = flux-profile ]; then
  timeout 420 python bench_models.py --models flux --controls --runs 11 --profile-device \
    --variants "patched (defaults),patched (no Q/K rotation),control" --out "$DEST/sm90_models_flux_profile.json"
  exit $?
fi
if [ "${1:-}" = rope ]; then
  timeout 90 python gpu_check.py --only rope > "$DEST/sm90_gpu_check_rope.log" 2>&1; tail -1 "$DEST/sm90_gpu_check_rope.log"
  grep "^BAD" "$DEST/sm90_gpu_check_rope.log"
  mkdir -p /tmp/ck && tar xJf ../.ck/comfy_kitchen.tar.xz -C /tmp/ck
  PYTHONPATH="/tmp/ck${PYTHONPATH:+:$PYTHONPATH}" timeout 90 python rope_cost.py --out "$DEST/sm90_rope_cost.json"
  timeout 200 python bench_models.py --models flux --controls --runs 15 \
    --variants "patched (defaults),patched (ComfyUI's RoPE),control" --out "$DEST/sm90_models_flux_rope.json"
  timeout 200 python bench_models.py --models wan21 --controls --runs 7 \
    --variants "patched (defaults),patched (ComfyUI's RoPE),control" --out "$DEST/sm90_models_wan_rope.json"
  exit 0
fi
echo "== rotation A/B"; date -u
timeout 150 python rotation_cost_ab.py --rounds 3 --out "$DEST/sm90_rotation_cost_ab.json"
echo "== host cost per passed-on call"
timeout 45 python pass_on_cost.py --rounds 31
echo "== SDXL, SD1.5"; date -u
timeout 150 python bench_models.py --models sdxl,sd15 --controls --runs 41 \
  --variants "patched (defaults),control" --out "$DEST/sm90_models_issue42_sdxl_sd15.json"
echo "== Flux"; date -u
timeout 180 python bench_models.py --models flux --controls --runs 15 \
  --variants "patched (defaults),patched (no Q/K rotation),control" --out "$DEST/sm90_models_issue42_flux.json"
date -u
