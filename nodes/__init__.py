"""ComfyUI integration, grouped by role; imports run one way, top to bottom here.

- ``ui/``: the node classes (classic and V3), their registration and the figures their tooltips quote.
- ``patching`` (a patched clone of a MODEL) and ``core_backends`` (core's attention registry, what a patch
  replaced): where the layers below are wired onto ComfyUI; both import ComfyUI lazily.
- ``routing/``: per attention call: binding, the kernel-or-fallback decision and its cache, the forward plans,
  q/k/v containers, the non-finite guard.
- ``reporting/``: call counters, the per-run summary, ``GET /sage/status``.
- ``config/``: the user's settings, install.py's measurements, and the kernel plan made from them.
- ``backends/``: attention other than our kernel: the fallbacks, Sage Settings' alternative backends, layers
  that name their own.

Everything except ``ui/``, ``patching`` and ``core_backends`` imports without ComfyUI.
tests/test_import_floors.py holds the order (no import cycle between modules here).

Where to find (and change) what decides a run:

- a tile size for RDNA4 (or any GPU family): ``kernels/arch.py``, the ``_FAMILIES`` table (a field a row leaves
  out is ``KernelConfig``'s default) and ``default_config``'s per-head-size changes; docs/AMD.md says why.
- the short-sequence rule (calls too short for the kernel go to the fallback): ``routing/dispatch.py``'s
  ``fallback_reason`` on the plan ``config/planner.py`` makes (the key length measured by install.py's
  crossover, ``installer/selftest.py``, else the table's ``min_seq_len``; the work per call from it).
- the run-summary text: ``reporting/run_summary.py`` (the log line) and ``reporting/panel_text.py`` (the
  panel's lines and toasts, sent to the browser; ``web/`` draws them as sent).
- the RoPE kernel: ``kernels/rope.py``; where it replaces ComfyUI's RoPE: ``routing/rope_hooks.py``.
- one attention call's path: the functions ComfyUI calls (the Patch node's override, core's registry entry,
  their container entries) are made in ``routing/override.py``; each goes to ``PatchState.dispatch``
  (``routing/dispatch.py``): the decision (``call_cache`` or the full checks), the one kernel-or-fallback step,
  ``PatchState.count`` (the counters, and the forward plan learning from the decision). q/k/v holders add only
  ``containers.Holders``; the non-finite guard holds a forward's counts (``reporting/stats.held_counts``).
- one attention call's checks and layouts: ``routing/attention_call.py``; the kernel library's host side:
  ``kernels/api.py`` (public API), ``checks``, ``host``, ``host_quant``, ``hopper_host``, ``custom_op``, ``launch``.
- why a call fell back or stayed dense: ``reporting/reasons.py`` (named members; the log level and the run
  summary's hints match on them); what failed in this process: ``kernels/failures.py`` (one ``reset()``).
- what install.py measured: ``config/install_report.py``, the one module here that imports ``installer/``
  (the report itself parsed once per file change into ``installer/report_facts.ReportFacts``).
"""
