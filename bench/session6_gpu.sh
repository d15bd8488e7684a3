#!/usr/bin/env bash
# The sixth session's H200 calls (issue 54), each under 10 minutes; logs and JSON are packed into one
# $OUT/r<part>.tgz (the device returns at most 8 files). Carries: .comfyui .whl .ck for `first`, .ck otherwise.
#   first   gpu_check sparse (the fifth session's row sums, centre means and extra router on a GPU for the
#           first time), then Wan 2.1 720p per forward with the INT8 sparse default beside core's sol_attn
#   table   the hostile cases (huge logits' new criterion), the sparse table at 32,760-103,950 tokens, random
#           family included, INT8 and FP8, and 160,000 x 40 at tau 1.3
#   fix     the router's TF32 guard on the GPU: hostile cases, gpu_check sparse, routing share; the extra tokens
#   t39     after `bash .triton-stage/stage-triton put .triton-stage` (carry part-aa, stage-triton), carry part-ab,
#           amd-py.tar.xz, stage-triton and .ck: the extra tokens' check and timing under Triton 3.9
#   more    the extra tokens at 103,950 x 56 against sol_attn's token_aug; the 32K router tiles
set -u
PART=${1:?first|table|fix|t39|more}
RET="$(realpath -m "${OUT:-bench/results}")"
export OUT=/tmp/r COMFYUI_PATH="$PWD/.comfyui" PYTHONUNBUFFERED=1
mkdir -p "$OUT" /tmp/ck
ls .whl/*.whl >/dev/null 2>&1 && python -m pip install -q --no-deps .whl/*.whl
tar -xJf .ck/comfy_kitchen.tar.xz -C /tmp/ck && export PYTHONPATH="/tmp/ck${PYTHONPATH:+:$PYTHONPATH}"
if [ "$PART" = t39 ]; then  # the second of two calls back to back (the first: stage-triton put, part-aa)
  bash bench/triton39_gpu.sh stage || exit 1
  export PYTHONPATH="/tmp/triton-staged${PYTHONPATH:+:$PYTHONPATH}" TRITON_DEFAULT_FP_FUSION=1 TRITON_CACHE_DIR=/tmp/triton-staged-cache
fi
cd bench
step() { local name=$1 t=$2; shift 2; echo "== $name"; local t0=$SECONDS
  timeout "$t" python "$@" > "$OUT/$name.log" 2>&1; echo "   exit $? in $((SECONDS - t0)) s"; tail -"${TAIL:-4}" "$OUT/$name.log"
  tar czf "$RET/r$PART.tgz" -C /tmp r; }  # after each step: a call cut by its limit still returns the rest
case "$PART" in
  first)
    TAIL=6 step sm90_gpu_check_sparse_session6 230 gpu_check.py --only sparse
    grep -v "^ok" "$OUT/sm90_gpu_check_sparse_session6.log" | head -12
    TAIL=14 step sm90_sparse_models_forward_session6 330 bench_sparse_models.py --runs 3 --skip-sampling \
      --out "$OUT/sm90_sparse_models_forward_session6.json" ;;
  table)
    TAIL=3 step sm90_sparse_hostile_session6 90 -c "from common import import_pack; import_pack(); import sparse_check as s; s.hostile_cases()"
    TAIL=80 step sm90_sparse_bench_session6 290 bench_sparse.py --shapes 103950x56,75600x24,32760x24 \
      --families video,local_sinks,random --settings tau:1.0,tau:1.3,tau:1.5 --extra 0 --pv int8,fp8 --reps 2 \
      --out "$OUT/sm90_sparse_bench_session6.json"
    TAIL=40 step sm90_sparse_bench_160k_session6 150 bench_sparse.py --shapes 160000x40 \
      --families video,local_sinks,random --settings tau:1.3 --extra 0 --pv int8,fp8 --reps 2 \
      --out "$OUT/sm90_sparse_bench_160k_session6.json" ;;
  fix)  # the router's TF32 guard: hostile, the whole sparse check, the routing share at 32K and 75.6K
    TAIL=3 step sm90_sparse_hostile_tf32guard 90 -c "from common import import_pack; import_pack(); import sparse_check as s; s.hostile_cases()"
    TAIL=3 step sm90_gpu_check_sparse_tf32guard 200 gpu_check.py --only sparse
    grep -v "^ok" "$OUT/sm90_gpu_check_sparse_tf32guard.log" | head -8
    TAIL=16 step sm90_sparse_bench_tf32guard 90 bench_sparse.py --shapes 32760x24,75600x24 --families video,local_sinks \
      --settings tau:1.3 --extra 0 --pv int8 --reps 2 --out "$OUT/sm90_sparse_bench_tf32guard.json"
    TAIL=20 step sm90_sparse_extra_session6 150 bench_sparse.py --shapes 103950x56 --families video,local_sinks \
      --settings tau:1.3 --extra 128,256 --pv int8 --reps 2 --out "$OUT/sm90_sparse_extra_session6.json" ;;
  t39)  # the extra router's 64-query-block path (Triton >= 3.8 on Hopper) on the GPU for the first time
    python -c "import triton; print('triton', triton.__version__)"
    TAIL=12 step sm90_sparse_extra_check_triton39 240 -c "from common import import_pack; import_pack(); import sparse_check as s; s.extra_cases()"
    TAIL=12 step sm90_sparse_extra_triton39 200 bench_sparse.py --shapes 103950x56 --families video,local_sinks \
      --settings tau:1.3 --extra 256 --pv int8 --reps 2 --out "$OUT/sm90_sparse_extra_triton39.json" ;;
  more)
    TAIL=20 step sm90_sparse_extra_session6 150 bench_sparse.py --shapes 103950x56 --families video,local_sinks \
      --settings tau:1.3 --extra 128,256 --pv int8 --reps 2 --out "$OUT/sm90_sparse_extra_session6.json"
    TAIL=30 step sm90_sparse_route_ab_32k_session6 110 sparse_route_ab.py --shapes 32760x24 --rounds 2 \
      --variants "default,route 64x32 w4,route 64x16 w4" --out "$OUT/sm90_sparse_route_ab_32k_session6.json" ;;
esac
