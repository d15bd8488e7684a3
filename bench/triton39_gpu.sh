#!/usr/bin/env bash
# Issue 38 item 5 (and 39's gpu_check) on the H200 with a staged Triton 3.9, in calls made back to back
# (the machine keeps /tmp ~30 s after a call). From the repository root:
#
#   call 1, carry [".triton-stage/part-aa", ".triton-stage/stage-triton"]:  bash bench/triton39_gpu.sh stage
#   call 2, carry [".triton-stage/part-ab", ".triton-stage/amd-py.tar.xz", ".triton-stage/stage-triton"]:
#                                                                          bash bench/triton39_gpu.sh check
#   (.triton-stage/stage-triton: a copy of ../shared/tools/stage-triton, which the GPU machine lacks)
#   call 3, nothing carried:                                               bash bench/triton39_gpu.sh speed
#   then, nothing carried: `checks` (gpu_check's hostile and families parts on 3.9 and 3.6 at once:
#   correctness only, the processes share the GPU; PARTS39 / PARTS36 pick the parts, e.g. PARTS39=families
#   PARTS36= for the families on 3.9 alone) and `speed8k` (bench_kernels at 2x24x8192x128, 3.6 and 3.9
#   alternating, ROUNDS times).
#
# The staged wheel has no CUDA 12 ptxas (stage-triton keeps only ptxas-blackwell); the PyPI wheel ships
# CUDA 12.9's as bin/ptxas, which the pack assembles the sm90 Gluon kernels with
# (triton_compat.sm90_ptxas_scope). Here that slot gets the machine's own Triton 3.6 ptxas (CUDA 12.8),
# so the staged 3.9 behaves as an installed one. Logs and JSON go to $OUT (or bench/results).
set -u
DEST="$(realpath -m "${OUT:-bench/results}")"
mkdir -p "$DEST"
export PYTHONUNBUFFERED=1
STAGED=/tmp/triton-staged
t39() {  # run a command under the staged Triton 3.9
  PYTHONPATH="$STAGED${PYTHONPATH:+:$PYTHONPATH}" TRITON_DEFAULT_FP_FUSION=1 TRITON_CACHE_DIR=/tmp/triton-staged-cache "$@"
}
part() {  # part VERSION(36|39) PART [TIMEOUT]: one gpu_check part on one Triton, logged
  local run=(); [ "$1" = 39 ] && run=(t39)
  "${run[@]}" timeout "${3:-420}" python3 bench/gpu_check.py --only "$2" > "$DEST/sm90_gpu_check_$2_triton$1.log" 2>&1
}
kernel_rows() {  # kernel_rows VERSION SHAPES NAME: bench_kernels' SDPA / default / dispatch rows
  local run=(); [ "$1" = 39 ] && run=(t39)
  "${run[@]}" timeout 120 python3 bench/bench_kernels.py --dispatch-only --table-crossover --dtypes bfloat16 \
    --shapes "$2" --out "$DEST/sm90_kernels_$3.json" > "$DEST/sm90_kernels_$3.log" 2>&1
}
case "${1:?stage|check|speed|checks|speed8k}" in
stage)  # each call puts the parts it carries; once all are there, the CUDA 12 ptxas goes into its slot
  bash .triton-stage/stage-triton put .triton-stage || exit 1
  if [ -d "$STAGED/triton" ]; then
    own=$(python3 -c "import os, triton; print(os.path.dirname(triton.__file__))")
    ln -sf "$own/backends/nvidia/bin/ptxas" "$STAGED/triton/backends/nvidia/bin/ptxas"
  fi ;;
check)
  bash "$0" stage || exit 1
  t39 python3 -c "import triton; from sagetriton_import import import_pack; import_pack(run_init=False)
from sagetriton.kernels import triton_compat as t; print('triton', triton.__version__, 'sm90 Gluon ptxas:', t.sm90_ptxas())"
  part 39 core 330; tail -1 "$DEST/sm90_gpu_check_core_triton39.log"
  part 39 hostile 150; tail -1 "$DEST/sm90_gpu_check_hostile_triton39.log"
  grep "^BAD" "$DEST"/sm90_gpu_check_*_triton39.log | head -20 ;;
speed)
  test -d "$STAGED" || { echo "no staged Triton: run stage and check first"; exit 1; }
  for round in 1 2; do  # 3.6 and 3.9 alternating: drift of the machine falls on both
    timeout 100 python3 bench/gluon39_ab.py --rounds 5 > "$DEST/sm90_gluon39_ab_triton36_r$round.log" 2>&1
    t39 timeout 130 python3 bench/gluon39_ab.py --rounds 5 > "$DEST/sm90_gluon39_ab_triton39_r$round.log" 2>&1
  done
  tail -n 12 "$DEST"/sm90_gluon39_ab_*.log
  for v in 39 36; do
    kernel_rows $v 2x24x8192x128,1x24x16384x128,1x12x32768x128 "triton${v}_final"
    tail -n 14 "$DEST/sm90_kernels_triton${v}_final.log"
  done ;;
checks)
  test -d "$STAGED" || { echo "no staged Triton"; exit 1; }
  for p in ${PARTS39-hostile families}; do part 39 "$p" & done  # PARTS39 / PARTS36: the parts run on each
  for p in ${PARTS36-hostile families}; do part 36 "$p" & done  # Triton (empty: none)
  wait
  for f in "$DEST"/sm90_gpu_check_*_triton3?.log; do echo "$f: $(grep '^gpu_check' "$f")"; done
  grep -h "^BAD" "$DEST"/sm90_gpu_check_*_triton3?.log | head -20 ;;
speed8k)
  test -d "$STAGED" || { echo "no staged Triton"; exit 1; }
  for round in $(seq "${ROUNDS:-2}"); do
    for v in 36 39; do
      kernel_rows $v 2x24x8192x128 "8k_triton${v}_r$round"; grep "sage default" "$DEST/sm90_kernels_8k_triton${v}_r$round.log"
    done
  done ;;
*) echo "usage: bench/triton39_gpu.sh stage|check|speed|checks|speed8k"; exit 2 ;;
esac
