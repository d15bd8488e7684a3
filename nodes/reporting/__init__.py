"""What the pack tells the user about its runs: process-wide and per-run counters of kernel and fallback
calls (``stats``), the per-run summary logged and sent to the browser when sampling ends (``run_summary``),
and ``GET /sage/status`` with the GPU, defaults, plan, install report and last run (``status_route``,
a plain ``status_payload()`` plus the route on ComfyUI's server).
"""
