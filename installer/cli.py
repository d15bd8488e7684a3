"""install.py's command line: check the environment, build the kernels for this GPU, self-test, report.

Nothing here needs a C++ compiler, the CUDA toolkit or the HIP SDK: Triton (shipped with torch)
builds the kernels. Exit code 0 always (a failed optional step must not fail a ComfyUI-Manager
install), unless --strict.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from ..kernels.arch import CPU_ARCH
from . import build_diagnosis, doctor, firststart, selftest
from . import report as rep


def head_dim(text: str) -> int:
    """The kernels take head sizes 1..256 (kernels/api.py); anything else would fail every variant."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 256:
        raise argparse.ArgumentTypeError(f"must be a whole number from 1 to 256, got {text!r}")
    return value


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Build and self-test SageTriton's kernels for this machine.")
    p.add_argument("--check-targets", nargs="?", const="default", metavar="LIST",
                   help="cross-compile for these targets (comma-separated, e.g. sm89,sm90,gfx1201; default: "
                        "sm80,sm86,sm89,sm90,sm120,gfx1100,gfx1201,gfx942) and check the matrix instructions")
    p.add_argument("--json", action="store_true", help="with --check-targets: print only a JSON object")
    p.add_argument("--head-dim", type=head_dim, default=128,
                   help="head dimension to cross-compile for, 1-256 (default 128)")
    p.add_argument("--strict", action="store_true", help="exit 1 when any check, build or self-test fails")
    p.add_argument("--force", action="store_true", help="redo the build and self-test even if a report exists")
    p.add_argument("--skip-cross-compile", action="store_true", help="no GPU: skip the cross-compile check")
    p.add_argument("--quick", action="store_true",
                   help="build and test only the default variant (the others are checked on first use)")
    drop = p.add_mutually_exclusive_group()
    drop.add_argument("--provide-sageattention", action="store_true",
                      help="install a `sageattention` package backed by these kernels into this Python, for nodes "
                           "and engines that import SageAttention by name (never over a real SageAttention)")
    drop.add_argument("--remove-sageattention", action="store_true",
                      help="remove what --provide-sageattention installed (nothing else)")
    p.add_argument("--worker", metavar="STATE_JSON", help=argparse.SUPPRESS)  # internal: the self-test child
    p.add_argument("--mode", choices=("gpu", "interpreter"), default="gpu", help=argparse.SUPPRESS)
    p.add_argument("--no-progress", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.json and not args.check_targets:
        p.error("--json only applies to --check-targets (e.g. --check-targets sm90 --json)")
    return args


def check_targets_main(args) -> int:
    from . import crosscompile as cc
    try:
        names = cc.DEFAULT_TARGETS if args.check_targets == "default" else \
            [t.name for t in cc.parse_targets(args.check_targets)]
    except ValueError as e:
        print(f"install.py: {e}", file=sys.stderr)
        return 2
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        results = cc.check_targets_in_child(names, args.head_dim)
    else:
        results = cc.check_targets(names, args.head_dim, progress=not args.json)
    if args.json:
        print(json.dumps(results, indent=2, sort_keys=True))
    else:
        print(cc.format_table(results))
    return 1 if args.strict and not all(r.get("ok") for r in results.values()) else 0


def section(title: str) -> None:
    print(f"\n== {title} " + "=" * max(0, 70 - len(title)), flush=True)


def build_error_texts(report: dict) -> list:
    """Every build error a report holds: variants, the worker, the cross-compile."""
    texts = [r.get("build", {}).get("error") for r in (report.get("variants") or {}).values()]
    texts += [report.get("error")]
    texts += [c.get("error") for c in (report.get("cross_compile") or {}).values()]
    return [t for t in texts if t]


def print_report(report: dict, env=None) -> None:
    if report.get("variants"):
        print(selftest.format_variant_table(report["variants"]))
    known = build_diagnosis.explain_build_errors(build_error_texts(report), env)
    if known:  # a known (Windows) failure class: say what it is and the one fix, under the table
        print(doctor.format_checks(known))
    off = report.get("disabled_variants", [])
    if off:
        print(f"{len(off)} variant(s) turned off (the runtime will not pick them): {', '.join(off)}")
    if report.get("mode") == "gpu":
        for line in (selftest.format_long_sequence_kernel(report.get("long_sequence_kernel")),
                     selftest.format_rope_kernel(report.get("rope_kernel")),
                     selftest.format_pv_choice(report.get("pv_choice"))):
            if line:
                print(line)
        print(selftest.format_crossover(report.get("crossover")))
    if report.get("sdpa_probe"):
        p = report["sdpa_probe"]
        print(f"torch default SDPA on this GPU: {'safe' if p['safe'] else 'NOT safe'} ({p['reason']})")
    if report.get("error"):
        print(f"error: {report['error']}")
    if report.get("path"):
        print(f"report: {report['path']}")


def _reusable_report(arch, args):
    """The complete report of an earlier run for this machine, unless --force. A quick (one-variant)
    report does not answer a full run; a full one answers --quick, which must never replace it."""
    if args.force:
        return None
    existing = rep.load_report(rep.report_key(arch))
    if existing and existing.get("complete") and (args.quick or not existing.get("quick")):
        where = rep.current_report_path(arch)
        return in_run_order(dict(existing, path=str(where)) if where else existing, arch)
    return None


def in_run_order(report: dict, arch) -> dict:
    """The report's tables in the order a run prints them: the file is written with sorted keys, and a
    rerun must read like the first run."""
    from .crosscompile import DEFAULT_TARGETS

    variants = [selftest.name_of(v) for v in selftest.variants_for(arch)]
    return dict(report, variants=_ordered(report.get("variants"), variants),
                cross_compile=_ordered(report.get("cross_compile"), DEFAULT_TARGETS))


def _ordered(table, order):
    if not table:
        return table
    rank = {name: i for i, name in enumerate(order)}
    return dict(sorted(table.items(), key=lambda item: rank.get(item[0], len(rank))))  # others last, as stored


REUSED_GPU = ("Already built and self-tested for this GPU, torch, triton and pack version (use --force to redo);\n"
              "the results of that run:")
REUSED_CPU = ("Already self-tested through the Triton interpreter and cross-compiled for this torch, triton\n"
              "and pack version (use --force to redo); the results of that run:")


def install_main(args) -> int:
    print(f"SageTriton {rep.pack_version()} — kernel build and self-test")
    for d in rep.report_dirs():  # what killed runs left, whether or not this run tests anything
        if d.is_dir():
            firststart.clean_stale_workers(d)
    section("Environment")
    env = doctor.probe_environment()
    checks = doctor.run_checks(env)
    print(doctor.format_checks(checks), flush=True)
    failed = doctor.has_failures(checks)
    if env.torch_version is None or (env.triton_version is None and env.gpus):
        print("\nCannot build kernels without torch and triton; fix the lines above and run `python install.py` again.")
        return 1 if args.strict else 0

    doctor_dicts = [c.as_dict() for c in checks]
    if env.gpus:
        arch = env.arch(0)
        existing = _reusable_report(arch, args)
        section(f"Build + self-test on {arch.name} ({arch.arch}, {arch.family})")
        if existing:
            print(REUSED_GPU)
            report = existing
        else:
            print("Each kernel variant the Sage Settings node can pick is built and compared with torch SDPA.")
            report = firststart.run_setup(arch, "gpu", echo=True, doctor=doctor_dicts, quick=args.quick)
        print_report(report, env)
        bad = failed or report.get("disabled_variants") or not report.get("complete")
        return 1 if args.strict and bad else 0

    # No GPU: a rerun prints the same sections as the first run, from the saved report.
    existing = _reusable_report(CPU_ARCH, args)
    section("No GPU found")
    if existing:
        print(REUSED_CPU)
        report, cross = existing, existing.get("cross_compile")
        if cross:
            from . import crosscompile as cc
            section("Cross-compile (no GPU needed)")
            print(cc.format_table(cross))
        section("Self-test through the Triton interpreter")
    else:
        print("torch sees no CUDA or ROCm GPU on this machine. SageTriton still proves its kernels here:\n"
              "  1. the accuracy self-test through the Triton interpreter (CPU, small sizes),\n"
              "  2. a cross-compile for the common NVIDIA and AMD GPU families.")
        cross = None
        if not args.skip_cross_compile:
            section("Cross-compile (no GPU needed)")
            from . import crosscompile as cc
            if os.environ.get("TRITON_INTERPRET", "0") == "1":
                cross = cc.check_targets_in_child(cc.DEFAULT_TARGETS, args.head_dim)
            else:
                cross = cc.check_targets(cc.DEFAULT_TARGETS, args.head_dim, progress=True)
            print(cc.format_table(cross), flush=True)
        section("Self-test through the Triton interpreter")
        report = firststart.run_setup(CPU_ARCH, "interpreter", echo=True, doctor=doctor_dicts,
                                      cross_compile=cross, quick=args.quick)
    print_report(report, env)
    section("What this means")
    print("On this machine the pack leaves ComfyUI's attention in place: the nodes load, and a model\n"
          "patched by \"Patch Model Attention\" keeps running ComfyUI's own attention. On a machine with an\n"
          "NVIDIA (sm80+) or AMD (RDNA3 / RDNA4 / CDNA) GPU, `python install.py` builds and tests the kernels.")
    bad = failed or report.get("disabled_variants") or not report.get("complete") or \
        (cross is not None and not all(r.get("ok") for r in cross.values()))
    return 1 if args.strict and bad else 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        return firststart.worker_main(args.worker, args.mode, not args.no_progress)
    if args.check_targets:
        return check_targets_main(args)
    if args.provide_sageattention or args.remove_sageattention:
        from . import dropin

        ok, message = dropin.install() if args.provide_sageattention else dropin.remove()
        print(f"SageTriton install.py: {message}", file=sys.stdout if ok else sys.stderr)
        return 0 if ok else 1
    try:
        return install_main(args)
    except KeyboardInterrupt:
        raise
    except Exception as e:  # noqa: BLE001 - ComfyUI-Manager semantics: report, never fail the install
        import traceback

        traceback.print_exc()
        print(f"\nSageTriton install.py hit an unexpected error ({type(e).__name__}: {e}). The pack still loads; "
              "please report this output.")
        return 1 if args.strict else 0
