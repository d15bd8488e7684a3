"""Attention other than the SageTriton kernel: where a call goes when the kernel does not take it
(``fallback``: ComfyUI's own attention, SDPA, chunked math-only SDPA), the installed backends Sage Settings
can run instead for comparison (``alt_backends``), and the layers of a checkpoint that name their own
attention (``preferred_attention``). Leaf modules: they import nothing else from ``nodes``.
"""
