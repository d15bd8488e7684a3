"""ComfyUI integration.

Thin node classes (``settings_node``, ``patch_node``, ``registry``) over plain-function modules that
import without ComfyUI: ``settings`` (the user's choices), ``planner`` (kernel config and thresholds
per GPU and head size), ``dispatch`` (argument binding, the fallback decision, running it),
``fallback`` (ComfyUI's own attention, SDPA, chunked math-only SDPA), ``schedule`` (full-precision
steps), ``run_summary`` (per-run report), ``install_report`` (install.py's measurements), ``stats``
(counters, per-run bookkeeping), ``containers`` (current ComfyUI's single-owner q/k/v holders),
``override`` (the function ComfyUI calls, over ``dispatch`` and ``containers``),
``alt_backends`` (Sage Settings' backend choice). ``patching`` touches ComfyUI objects, importing it
lazily, as do ``core_backends`` (ComfyUI's attention registry, what a patch replaced) and ``v3_nodes``
(the nodes in ComfyUI's V3 schema).
"""
