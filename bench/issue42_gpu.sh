#!/usr/bin/env bash
# Issue 42 on one GPU, one call of ~6 minutes on an H200 (at most 8m45 by the timeouts). From the
# repository root, with ComfyUI 0.3.64 carried as .comfyui (git-ignored: cp -r ~/ComfyUI .comfyui,
# then run with carry [".comfyui", ".whl"], .whl holding the torchsde and trampoline wheels):
#
#   bash bench/issue42_gpu.sh            # results under $OUT (the device's output folder) or bench/results
#   bash bench/issue42_gpu.sh flux-profile   # only: Flux's forward by kind of kernel, unpatched and patched,
#                                            # then 11 interleaved runs with the controls (~4 minutes)
#
# 1. rotation_cost_ab.py: no rotation / the portable "dot" rotation / Hopper's "tiled" one / SDPA at
#    8K, 16K, 32K x 128, each quantization launch alone, and accuracy on bench/accuracy_cases.py.
# 2. pass_on_cost.py: the override's own host cost per passed-on call, dispatcher vs forward plan.
# 3. bench_models.py --controls: SDXL and SD1.5 (every call short: forwards passed through whole),
#    41 interleaved runs; Flux with the defaults and without the rotation, 15 runs.
set -u
export COMFYUI_PATH="${COMFYUI_PATH:-$PWD/.comfyui}"
# comfy.sample needs torchsde (and trampoline): their wheels carried in the git-ignored .whl/
ls .whl/*.whl >/dev/null 2>&1 && python -m pip install -q --no-deps .whl/*.whl
DEST="$(realpath -m "${OUT:-bench/results}")"
mkdir -p "$DEST"
cd bench || exit 1
if [ "${1:-}" = flux-profile ]; then
  timeout 420 python bench_models.py --models flux --controls --runs 11 --profile-device \
    --variants "patched (defaults),patched (no Q/K rotation),control" --out "$DEST/sm90_models_flux_profile.json"
  exit $?
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
