"""Each attention call of a patched model, from the override ComfyUI calls to the backend that runs it:
``override`` makes every function ComfyUI calls (the Patch node's override, core's registry entry, their
container entries); all hand calls to ``dispatch``'s one path (argument binding, the kernel-or-fallback decision,
running it, counting it), whose decisions ``call_cache`` remembers per call signature; ``containers`` adds what
current ComfyUI's single-owner q/k/v holders need; ``schedule`` places a call in the sampling schedule
(full-precision steps); ``forward_plan`` learns from the dispatcher's decisions and lets whole forwards skip it,
and ``nonfinite_guard`` redoes a forward that came out NaN/Inf on ComfyUI's attention. No ComfyUI import.
"""
