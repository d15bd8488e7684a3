#!/usr/bin/env bash
# Issue 38's GPU proof for whichever Triton comes first on PYTHONPATH (the machine's own, or one staged by
# ../shared/tools/stage-triton): gpu_check.py (every Gluon case must print ran=True) and bench_kernels.py's
# default-kernel rows at 8K-32K, head_dim 128, against SDPA. Logs and JSON go to OUTDIR, named by Triton
# version, so two runs compare side by side (3.9 within 3 % of 3.6 is the bar).
#   bash bench/triton_versions.sh OUTDIR check|bench
set -uo pipefail
out=${1:?output folder}; what=${2:?check or bench}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
v=$(python3 -c "import triton; print(triton.__version__)") || exit 1
case "$what" in
check) python3 bench/gpu_check.py 2>&1 | tee "$out/gpu_check_triton$v.log" ;;
bench) python3 bench/bench_kernels.py --dispatch-only --dtypes bfloat16 \
         --shapes 2x24x8192x128,1x24x16384x128,1x12x32768x128 --out "$out/kernels_triton$v.json" 2>&1 \
         | tee "$out/kernels_triton$v.log" ;;
*) echo "usage: bench/triton_versions.sh OUTDIR check|bench"; exit 2 ;;
esac
