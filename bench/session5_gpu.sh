#!/usr/bin/env bash
# Issue 54 on the H200, written by the fifth session (which had no GPU); the sixth ran most of it through
# bench/session6_gpu.sh (docs/RESULTS.md, "sixth session"); the 20-step `models_run` is still to do. Parts of
# under 10 minutes each, in the order they matter; each writes its logs and JSON to $OUT (else bench/results).
#   bash bench/session5_gpu.sh models      # carry .comfyui .whl .ck: Wan 2.1 at 720p per forward with the INT8
#                                          # sparse default (never measured), beside core's routing on sol_attn
#                                          # with and without its 256 extra tokens (current core's default)
#   bash bench/session5_gpu.sh models_run  # the same carries: the 20-step runs (first 20 % dense)
#   bash bench/session5_gpu.sh table   # carry .ck: the sparse table at 32,760-103,950 tokens, all three input
#                                      # families (random too), tau 1.0/1.3/1.5, INT8 and FP8, and the extra tokens
#                                      # at 103,950 x 56 against sol_attn's token_aug
#   bash bench/session5_gpu.sh table160  # carry .ck: 160,000 x 40, all families (not run since the first session)
#   bash bench/session5_gpu.sh check   # gpu_check sparse (with the extra tokens) and kcols, longer limits than before
# Triton 3.9 on the sparse kernels: bench/triton39_gpu.sh stage / check, then
#   PARTS39="sparse kcols" PARTS36= bash bench/triton39_gpu.sh checks
# and the extra router's 64-query-block path (Triton 3.8+ only), under the staged 3.9 from bench/:
#   PYTHONPATH=/tmp/triton-staged TRITON_DEFAULT_FP_FUSION=1 TRITON_CACHE_DIR=/tmp/triton-staged-cache \
#     python extra_ab.py --shape 103950x56 --qb 16,32
set -u
source bench/device_env.sh   # ends in bench/, DEST set
export PYTHONUNBUFFERED=1
step() { local name=$1; shift; echo "== $name: $*"; local t0=$SECONDS; "$@" > "$DEST/$name.log" 2>&1; echo "   exit $? in $((SECONDS - t0)) s"; tail -${TAIL:-4} "$DEST/$name.log"; }
kitchen() { mkdir -p /tmp/ck && tar -xJf ../.ck/comfy_kitchen.tar.xz -C /tmp/ck && export PYTHONPATH="/tmp/ck${PYTHONPATH:+:$PYTHONPATH}"; }
case "${1:-}" in
  models)  # forwards only (~3 min on the fourth session's H200 run, two more variants now)
    kitchen
    TAIL=40 step sm90_sparse_models_forward_session5 timeout 560 python bench_sparse_models.py --runs 3 \
       --skip-sampling --out "$DEST/sm90_sparse_models_forward_session5.json" ;;
  models_run)  # the 20-step runs: unpatched, dense, sparse with the first 20 % dense (~200 s before)
    kitchen
    TAIL=20 step sm90_sparse_models_sampling_session5 timeout 560 python bench_sparse_models.py --skip-forwards \
       --out "$DEST/sm90_sparse_models_sampling_session5.json" ;;
  table)
    kitchen
    TAIL=80 step sm90_sparse_bench_session5 timeout 420 python bench_sparse.py --shapes 32760x24,75600x24,103950x56 \
       --families video,local_sinks,random --settings tau:1.0,tau:1.3,tau:1.5 --extra 0 --pv int8,fp8 --reps 2 \
       --out "$DEST/sm90_sparse_bench_session5.json"
    TAIL=20 step sm90_sparse_extra_session5 timeout 150 python bench_sparse.py --shapes 103950x56 \
       --families video,local_sinks --settings tau:1.3 --extra 128,256 --pv int8 --reps 2 \
       --out "$DEST/sm90_sparse_extra_session5.json"
    TAIL=12 step sm90_extra_ab_session5 timeout 100 python extra_ab.py --shape 103950x56 --qb 32
    # the router's tiles were tuned at 103,950 x 56; at 32,760 x 24 its 96 programs leave SMs idle
    TAIL=30 step sm90_sparse_route_ab_32k timeout 120 python sparse_route_ab.py --shapes 32760x24 --rounds 2 \
       --variants "default,route 64x32 w4,route 64x16 w4" --out "$DEST/sm90_sparse_route_ab_32k.json" ;;
  table160)
    kitchen
    TAIL=40 step sm90_sparse_bench_160k_session5 timeout 560 python bench_sparse.py --shapes 160000x40 \
       --families video,local_sinks,random --settings tau:1.0,tau:1.3,tau:1.5 --extra 0 --pv int8,fp8 --reps 2 \
       --out "$DEST/sm90_sparse_bench_160k_session5.json" ;;
  check)
    TAIL=3 step sm90_gpu_check_sparse_session5 timeout 400 python gpu_check.py --only sparse
    TAIL=3 step sm90_gpu_check_kcols_session5 timeout 150 python gpu_check.py --only kcols ;;
  *) echo "usage: bash bench/session5_gpu.sh models|models_run|table|table160|check"; exit 2 ;;
esac
