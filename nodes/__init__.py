"""ComfyUI integration.

Thin node classes (``settings_node``, ``patch_node``, ``registry``) over plain-function modules that
import without ComfyUI: ``settings`` (the user's choices), ``dispatch`` (argument binding, kernel vs
fallback), ``fallback`` (ComfyUI's own attention, SDPA, chunked math-only SDPA), ``schedule``
(full-precision steps), ``run_summary`` (per-run report), ``install_report`` (install.py's
measurements), ``stats`` (counters). ``patching`` touches ComfyUI objects, importing it lazily.
"""
