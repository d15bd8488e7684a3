#!/usr/bin/env bash
# Issues 52 and 54 on the H200, fourth session, in parts of under 10 minutes each (device time is short).
#   bash bench/session4_gpu.sh final    # gpu_check kcols and sparse; the sparse table at 32,760-103,950 tokens
#   bash bench/session4_gpu.sh first    # Gluon sparse check, the pre-attention A/B, sparse at 103,950 x 56
#                                       # (Triton and Gluon kernels, fp8 and int8), per_thread K groups vs the reference
# Carry .ck (comfy-kitchen) and .ref (the reference SageAttention source). Results under $OUT (else bench/results).
set -u
source bench/device_env.sh   # ends in bench/, DEST set
export PYTHONUNBUFFERED=1
step() { local name=$1; shift; echo "== $name: $*"; local t0=$SECONDS; "$@" > "$DEST/$name.log" 2>&1; echo "   exit $? in $((SECONDS - t0)) s"; tail -${TAIL:-4} "$DEST/$name.log"; }
ref_build() {  # in the background: ~110 s on 16 cores, beside the GPU steps
  (cd ../.ref/SageAttention && touch README.md && MAX_JOBS=8 TORCH_CUDA_ARCH_LIST=9.0 timeout 300 \
     python setup_sm90.py build_ext --inplace > "$DEST/ref_build.log" 2>&1; echo "reference build exit $?" >> "$DEST/ref_build.log") &
}
case "${1:-}" in
  first)
    mkdir -p /tmp/ck && tar -xJf ../.ck/comfy_kitchen.tar.xz -C /tmp/ck && export PYTHONPATH="/tmp/ck${PYTHONPATH:+:$PYTHONPATH}"
    ref_build
    TAIL=12 step sm90_gpu_check_sparse_gluon timeout 120 python gpu_check.py --only sparse_gluon
    TAIL=30 step sm90_sparse_route_ab timeout 110 python sparse_route_ab.py --rounds 1 --calls 2 --out "$DEST/sm90_sparse_route_ab.json"
    TAIL=12 step sm90_sparse_s4_triton timeout 110 python bench_sparse.py --shapes 103950x56 --families video,local_sinks \
       --settings tau:1.3 --extra 0 --pv int8,fp8 --reps 2 --out "$DEST/sm90_sparse_s4_triton.json"
    TAIL=12 step sm90_sparse_s4_gluon timeout 90 python bench_sparse.py --gluon --shapes 103950x56 --families video,local_sinks \
       --settings tau:1.3 --extra 0 --pv fp8 --reps 2 --out "$DEST/sm90_sparse_s4_gluon.json"
    wait; tail -2 "$DEST/ref_build.log"
    export PYTHONPATH="$PWD/../.ref/SageAttention${PYTHONPATH:+:$PYTHONPATH}"
    TAIL=20 step sm90_dropin_kgroups timeout 100 python bench_dropin.py --names sageattn_qk_int8_pv_fp8_cuda_sm90,sageattn_qk_int8_pv_fp8_cuda \
       --k-scales groups,keys --no-lse --out "$DEST/sm90_dropin_kgroups.json" ;;
  final)  # the merged defaults: per_thread's K groups checked, sparse checked, the sparse table (INT8 and FP8 P·V)
    mkdir -p /tmp/ck && tar -xJf ../.ck/comfy_kitchen.tar.xz -C /tmp/ck && export PYTHONPATH="/tmp/ck${PYTHONPATH:+:$PYTHONPATH}"
    TAIL=60 step sm90_sparse_bench_session4 timeout 220 python bench_sparse.py --shapes 75600x24,103950x56,32760x24 \
       --families video,local_sinks --settings tau:1.0,tau:1.3,tau:1.5 --extra 0 --pv int8,fp8 --reps 2 \
       --out "$DEST/sm90_sparse_bench_session4.json"
    TAIL=3 step sm90_gpu_check_kcols_groups timeout 60 python gpu_check.py --only kcols
    TAIL=3 step sm90_gpu_check_sparse_session4 timeout 80 python gpu_check.py --only sparse ;;
  *) echo "usage: bash bench/session4_gpu.sh first|final"; exit 2 ;;
esac
