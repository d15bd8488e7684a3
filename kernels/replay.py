"""Launch replay: a call repeating an earlier call's shapes re-issues its recorded launches.

A call's host work (checks, buffer sizes, grids, the quantized buffers, tensor descriptors, the
arguments of each launch) depends only on the inputs' shapes, strides, dtypes and the options, so it
is done once per such signature. The first call runs in full and its launches are recorded; a
repeat call fills its own inputs and a fresh output into the recorded arguments and launches: the
same kernels with the same arguments but for those tensors, so the same results. Where Triton allows,
the launches go straight to the compiled kernels' launchers (``launcher``), skipping ``JITFunction.run``.

The quantized buffers are reused from call to call. That is safe on one stream: each call's first
launch is an ordinary launch, which starts only after the previous call's kernels have ended. So
the key holds the stream and the thread, and only calls whose buffers are small (where host time
matters) are kept, a few signatures at most; the nodes drop them at the end of each sampling run.
"""
from __future__ import annotations

import threading
from typing import Optional

import torch

from . import failures, launcher

# Device types whose calls are replayed (tests add "cpu": the interpreter runs launches in order too).
DEVICE_TYPES = ("cuda",)
MAX_BYTES = 96 << 20  # buffers one recording may keep alive (Flux, and Qwen-Image with CFG, at 1024²)
MAX_ENTRIES = 4

# ``failures.memory``: .replays (key -> Recording, oldest first) and .refused_replays (keys whose buffers came out
# too large to keep: their calls skip recording, which costs about as much host time again as the call itself, a
# direct launch built per launch, for nothing); both change as a whole under its lock (one thread per GPU
# records at once).
_memory = failures.memory
MAX_REFUSED = 64
_local = threading.local()  # .launches: the list the call being recorded appends to


def _tensor_key(t: Optional[torch.Tensor]):
    return None if t is None else (t.shape, t.stride(), t.dtype)


def worth_recording(q, k, v) -> bool:
    """Whether a call's buffers (about a byte per element of q, k and v) are small enough to be kept."""
    return q.numel() + k.numel() + v.numel() <= MAX_BYTES


def call_key(q, k, v, attn_mask, cfg, options: tuple) -> Optional[tuple]:
    """The signature a recording is valid for, or None where calls are not replayed."""
    device = q.device
    if device.type not in DEVICE_TYPES:
        return None
    stream = _current_stream(device) if device.type == "cuda" else 0
    return (_tensor_key(q), _tensor_key(k), _tensor_key(v), _tensor_key(attn_mask), device, id(cfg), options,
            stream, threading.get_ident())


def _current_stream(device: Optional[torch.device] = None) -> int:
    """``device``'s current stream (default: the current device's), the one Triton launches on under the
    call's device guard (``devices``); its own lookup, not a Stream object."""
    index = device.index if device is not None and device.index is not None else torch.cuda.current_device()
    try:
        from torch._C import _cuda_getCurrentRawStream
    except ImportError:
        return torch.cuda.current_stream(index).cuda_stream
    return _cuda_getCurrentRawStream(index)


def lookup(key, cfg) -> Optional[Recording]:
    rec = _memory.replays.get(key)
    return rec if rec is not None and rec.cfg is cfg else None  # id(cfg) in the key: the same object


def refused(key) -> bool:
    """Whether a call with ``key`` was recorded before and its buffers were too large to keep."""
    return key in _memory.refused_replays


def start() -> None:
    """Record the launches of the call about to run (this thread)."""
    _local.launches = []


def stop() -> list:
    launches, _local.launches = getattr(_local, "launches", None), None
    return launches or []


def note_launch(kernel, grid, args: tuple, kwargs: dict, compiled=None) -> None:
    """Called by ``launch._launch`` after each launch; ``compiled``: what ``kernel[grid](...)`` returned."""
    launches = getattr(_local, "launches", None)
    if launches is not None:
        direct = None
        first = next((a for a in args if isinstance(a, torch.Tensor)), None)  # Gluon kernels start with descriptors
        if compiled is not None and first is not None and first.device.type == "cuda":
            direct = launcher.direct_launch(kernel, grid, args, kwargs, compiled, _current_stream(first.device))
        launches.append((kernel, grid, args, kwargs, direct))


class Recording:
    """One call's launches, with the call's own tensors (inputs, output, mask, LSE) marked as slots."""

    __slots__ = ("cfg", "launches", "direct", "alignment", "zero", "lse", "nbytes", "direct_calls")

    def __init__(self, cfg, launches: list, launch_slots: list, direct: Optional[list], alignment: tuple,
                 zero: tuple, lse, nbytes: int):
        self.cfg = cfg  # kept alive: the key holds its id
        self.launches = list(zip(launches, launch_slots, strict=True))
        self.direct = direct  # a ``launcher.DirectLaunch`` per launch, or None (through ``kernel[grid]``)
        self.alignment = alignment  # the slots' pointer alignment the compiled kernels were specialized for
        self.zero = zero  # workspaces a launch expects zeroed
        self.lse = lse  # the empty LSE when none was asked for
        self.nbytes = nbytes
        self.direct_calls = 0  # replays that went through the launchers (tests and benchmarks read it)

    def replay(self, tensors: tuple) -> None:
        """Launch again with ``tensors`` in the slots (the order ``record`` got them in)."""
        for t in self.zero:
            t.zero_()
        start = 0
        if self.direct is not None and _alignment(tensors) == self.alignment:
            hooks = launcher.idle_hooks()
            if hooks is not None:
                start = self._launch_direct(tensors, hooks)
                if start == len(self.launches):
                    self.direct_calls += 1
                    return
        for (kernel, grid, args, kwargs), slots in self.launches[start:]:
            if slots:
                args = list(args)
                for pos, slot in slots:
                    args[pos] = tensors[slot]
            kernel[grid](*args, **kwargs)

    def _launch_direct(self, tensors: tuple, hooks: tuple) -> int:
        """Launch through the launchers; returns how many were launched: all, or those before one that
        raised (it launched nothing: the call fails while its arguments are passed), which the caller
        launches the normal way with the rest. Direct launches are then off for that kernel."""
        for i, (direct, (_, slots)) in enumerate(zip(self.direct, self.launches, strict=True)):
            try:
                direct(slots, tensors, hooks)
            except Exception as e:  # noqa: BLE001 - e.g. a Triton whose launcher takes other arguments
                launcher.disable(direct.kernel, e)
                self.direct = None
                _forget_direct(direct.kernel)
                return i
        return len(self.launches)


def _forget_direct(kernel) -> None:
    """Every recording with a direct launch of ``kernel`` replays through ``kernel[grid]`` from now on."""
    with _memory.lock:
        recs = list(_memory.replays.values())
    for rec in recs:
        if rec.direct is not None and any(d.kernel is kernel for d in rec.direct):
            rec.direct = None


def _alignment(tensors: tuple) -> tuple:
    return tuple(t is not None and launcher.aligned(t) for t in tensors)


def record(key, cfg, launches: list, tensors: tuple, zero: tuple = (), lse=None) -> Optional[Recording]:
    """Keep ``launches`` (from ``start``/``stop``) for ``key``, ``tensors`` being the call's own tensors
    (slots); None (nothing kept) when a launch holds one of them in a way a slot cannot replace (a
    descriptor over it, another view of it) or the buffers are too large."""
    ids = {id(t): i for i, t in enumerate(tensors) if t is not None}
    user = {t.untyped_storage().data_ptr() for t in tensors if t is not None and t.numel()}
    buffers: dict = {}
    launch_slots, kept, direct = [], [], []
    for kernel, grid, args, kwargs, fast in launches:
        slots = []
        for pos, a in enumerate(args):
            if id(a) in ids:
                slots.append((pos, ids[id(a)]))
                continue
            base = a if isinstance(a, torch.Tensor) else getattr(a, "base", None)  # tensor descriptors
            if isinstance(base, torch.Tensor):
                ptr = base.untyped_storage().data_ptr()
                if ptr in user and base.numel():
                    return None
                buffers[ptr] = base.untyped_storage().nbytes()
        launch_slots.append(tuple(slots))
        held = list(args)
        for pos, _ in slots:  # the call's own tensors are not kept alive by the recording
            held[pos] = None
            if fast is not None:
                fast.values[pos] = None
        kept.append((kernel, grid, tuple(held), kwargs))
        direct.append(fast)
    nbytes = sum(buffers.values())
    if not launches:
        return None
    if nbytes > MAX_BYTES:
        with _memory.lock:
            refused = _memory.refused_replays
            refused[key] = None
            while len(refused) > MAX_REFUSED:
                refused.pop(next(iter(refused)))
        return None
    rec = Recording(cfg, kept, launch_slots, direct if all(d is not None for d in direct) else None,
                    _alignment(tensors), zero, lse, nbytes)
    with _memory.lock:
        recordings = _memory.replays
        recordings.pop(key, None)
        recordings[key] = rec
        while len(recordings) > MAX_ENTRIES:
            recordings.pop(next(iter(recordings)))
    return rec


def clear(this_thread: bool = False) -> None:
    """Forget every recording (their buffers are freed with them); ``this_thread``: only the calling
    thread's, so a sampling run ending on one GPU's thread leaves another's running one its own."""
    with _memory.lock:
        if not this_thread:
            _memory.replays.clear()
            _memory.refused_replays.clear()
            return
        me = threading.get_ident()
        for table in (_memory.replays, _memory.refused_replays):
            for key in [k for k in table if k[-1] == me]:
                del table[key]
