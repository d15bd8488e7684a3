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
"""
