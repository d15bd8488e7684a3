"""Each attention call of a patched model, from the override ComfyUI calls to the backend that runs it:
``override`` (the function ComfyUI calls) and ``containers`` (current ComfyUI's single-owner q/k/v holders)
hand calls to ``dispatch`` (argument binding, kernel-or-fallback decision, running it), whose decisions
``call_cache`` remembers per call signature; ``schedule`` places a call in the sampling schedule
(full-precision steps); ``forward_plan`` lets whole forwards skip the dispatcher, and ``nonfinite_guard``
redoes a forward that came out NaN/Inf on ComfyUI's attention. No ComfyUI import.
"""
