#!/usr/bin/env bash
# Issue 49 on one GPU: a patched model compiled with inductor as ComfyUI's TorchCompileModel node compiles it,
# in both orders, against the uncompiled patched model (bench/compile_models.py). From the repository root,
# with ComfyUI 0.3.64 carried as .comfyui (git-ignored: cp -r ~/ComfyUI .comfyui, then run with carry
# [".comfyui", ".whl"], .whl holding the torchsde and trampoline wheels). One part per call, each under 10 minutes:
#
#   bash bench/issue49_gpu.sh flux      # Flux dev 1024x1024 (~5 minutes with the compilation)
#   bash bench/issue49_gpu.sh wan       # Wan 2.1 1.3B 480x832x81 (~4 minutes)
#   bash bench/issue49_gpu.sh control   # Wan with the unpatched model compiled too: what compile gives alone
#
# Results under $OUT (the device's output folder) or bench/results: JSON rows and the log with its table.
set -u
source bench/device_env.sh
run() {  # $1: name, then compile_models.py's arguments
  local name=$1
  shift
  timeout 560 python compile_models.py "$@" --out "$DEST/sm90_compile_$name.json" > "$DEST/sm90_compile_$name.log" 2>&1
  echo "exit $?"
  grep -E "^BAD|^ +(model|flux|wan21) " "$DEST/sm90_compile_$name.log"
}
case "${1:-}" in
  flux) run flux --models flux --runs 7 ;;
  wan) run wan --models wan21 --runs 5 ;;
  control) run wan_control --models wan21 --runs 5 --unpatched-compiled ;;
  *) echo "usage: bash bench/issue49_gpu.sh flux|wan|control"; exit 2 ;;
esac
