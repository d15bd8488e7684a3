#!/usr/bin/env bash
# Issues 52 and 54 on the H200, in parts of under 10 minutes each (device time is short: batch them).
#   bash bench/session_gpu.sh dropin   # reference SageAttention built for sm90 (carry .ref), gpu_check kcols,
#                                      # bench_dropin (every name against the reference, the LSE's cost), lse_breakdown
#   bash bench/session_gpu.sh sparse   # gpu_check lse + sparse, bench_sparse against comfy-kitchen (carry .ck)
# Results under $OUT (else bench/results).
set -u
source bench/device_env.sh   # ends in bench/, DEST set
step() { local name=$1; shift; echo "== $name: $*"; local t0=$SECONDS; "$@" > "$DEST/$name.log" 2>&1; echo "   exit $? in $((SECONDS - t0)) s"; tail -${TAIL:-4} "$DEST/$name.log"; }
case "${1:-}" in
  dropin)
    (cd ../.ref/SageAttention && touch README.md && MAX_JOBS=16 TORCH_CUDA_ARCH_LIST=9.0 timeout 200 \
       python setup_sm90.py build_ext --inplace > "$DEST/ref_build.log" 2>&1; echo "reference build exit $?")
    export PYTHONPATH="$PWD/../.ref/SageAttention${PYTHONPATH:+:$PYTHONPATH}"
    step sm90_gpu_check_kcols timeout 150 python gpu_check.py --only kcols
    TAIL=30 step sm90_dropin_kcols timeout 240 python bench_dropin.py --out "$DEST/sm90_dropin_kcols.json"
    TAIL=30 step sm90_lse_breakdown_after timeout 60 python lse_breakdown.py --lengths 8192,16384,65536 ;;
  sparse)
    mkdir -p /tmp/ck && tar -xJf ../.ck/comfy_kitchen.tar.xz -C /tmp/ck && export PYTHONPATH="/tmp/ck${PYTHONPATH:+:$PYTHONPATH}"
    step sm90_gpu_check_sparse_session3 timeout 150 python gpu_check.py --only sparse
    TAIL=40 step sm90_sparse_bench_session3 timeout 240 python bench_sparse.py --shapes 32760x24,103950x56 \
       --families video,local_sinks --settings tau:1.0,tau:1.3,tau:1.5 --extra 0 --pv fp8,int8 \
       --out "$DEST/sm90_sparse_bench_session3.json"
    step sm90_gpu_check_kcols_guard timeout 140 python gpu_check.py --only kcols
    step sm90_gpu_check_lse_session3 timeout 125 python gpu_check.py --only lse ;;
  *) echo "usage: bash bench/session_gpu.sh dropin|sparse"; exit 2 ;;
esac
