"""ComfyUI integration. Modules here that import ComfyUI are only loaded when it is present;
``stats``, ``dispatch_rules`` and the other plain-function modules import without it."""
