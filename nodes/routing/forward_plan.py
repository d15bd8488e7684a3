"""Decisions per forward: a forward whose attention calls all go to ComfyUI's attention runs without the
override, and in a forward that mixes, the calls that go there skip the dispatcher.

The first forward of an input shape runs through the dispatcher, which tells the forward's record each
call's decision (``PatchState.count``: where it went, and why when not to the kernel). Its plan is kept
under the forward's key (input shapes, the attention patches, the full-precision-step flag) for the same
settings, earlier override and install report:

- every call fell back to ComfyUI's attention (SDXL, SD1.5: every key shorter than the crossover): later
  forwards run with the override taken out of ``transformer_options`` (the earlier override put back),
  so ComfyUI calls its attention straight; the run summary counts those forwards and their calls;
- otherwise: position i of a later forward, if its q and k have the shapes position i had and it went to
  ComfyUI's attention then, goes there again at once; any other call goes through the dispatcher.

A model's calls run in the same order for the same inputs; where they do not, a shape check sends the
call to the dispatcher, so a wrong plan costs speed, never a kernel call the checks would refuse. Only
where the dispatcher's fallbacks went to ComfyUI's attention as called (``call_cache.COMFY``): a fallback
to math-only SDPA (RDNA4) or to our own SDPA stays with the dispatcher. The plan's check before the
dispatcher is part of the override (``override.make_attention_override``).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Optional

import torch

from .call_cache import COMFY, put_bounded
from .dispatch import PatchState
from .nonfinite_guard import REASON as REDO_REASON

WRAPPER_KEY = "sagetriton_forward_plan"
OVERRIDE_KEY = "optimized_attention_override"
MAX_PLANS = 64  # input shapes change every forward (a sweep): start over instead of growing
PATCH_KEYS = ("patches", "patches_replace")  # attention patches can change what a forward calls
SIGMA_KEYS = ("sigmas", "sample_sigmas")  # the step, not the calls (full-precision steps are a key of their own)


class ForwardPlan:
    """What the first forward of one key showed."""

    __slots__ = ("whole", "calls", "reasons")

    def __init__(self, whole: Optional[dict], calls: list, reasons: list):
        self.whole = whole  # {reason: calls} when every call fell back: the forward runs without the override
        self.calls = calls  # per position: (q shape, k shape, index in reasons) of a call that fell back, or None
        self.reasons = reasons


class _Forward:
    """The forward in progress on this thread (``PatchState.local.forward``): the plan it follows, or what its
    calls showed while learning one (read by the dispatcher and by ``override.make_attention_override``)."""

    __slots__ = ("plan", "pos", "counts", "shapes", "decisions")

    def __init__(self, plan: Optional[ForwardPlan]):
        self.plan = plan  # None: learning
        self.pos = 0  # the next call's position
        self.counts = [0] * len(plan.reasons) if plan is not None else None  # calls the plan sent, by reason
        self.shapes: Optional[list] = [] if plan is None else None  # learning: (q shape, k shape) per tensor call
        self.decisions: Optional[list] = [] if plan is None else None  # learning: (route, reason) per call


def _meta(value):
    if isinstance(value, torch.Tensor):
        return value.shape, value.dtype, value.device
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return tuple(map(_meta, value))
    if isinstance(value, dict):
        return tuple((k, _meta(v)) for k, v in value.items())
    return "id", id(value)  # an object: the same one, or not the same forward


def _patches_meta(patches) -> tuple:
    """Which attention patches are set (by identity: the same functions give the same calls)."""
    if not isinstance(patches, dict):
        return ("id", id(patches)),
    return tuple((name, tuple(map(id, fns.values() if isinstance(fns, dict) else fns))
                  if isinstance(fns, (list, tuple, dict)) else id(fns)) for name, fns in patches.items())


def forward_key(args: tuple, kwargs: dict, topts: dict, full_precision: bool) -> tuple:
    """What decides a forward's attention calls: the model inputs' shapes (not values), the attention
    patches and tensors in ``transformer_options``, and whether this is a full-precision step."""
    x, t, c_concat, c_crossattn, control = args[:5]
    key = (_meta(x), _meta(t), _meta(c_concat), _meta(c_crossattn), control is None, full_precision,
           _meta(args[6:]), _meta(kwargs))
    for name, value in topts.items():
        if name in PATCH_KEYS:
            key += (name, _patches_meta(value))
        elif isinstance(value, torch.Tensor) and name not in SIGMA_KEYS:
            key += (name, value.shape, value.dtype, value.device)
    return key


class ForwardPlans:
    """One patched model's plans by forward key, valid for one (settings, earlier override, report generation)."""

    def __init__(self, state: PatchState) -> None:
        self.state = state
        self.entries: dict[tuple, ForwardPlan] = {}
        self.stamp: tuple = (None, None, None)
        self.local = state.local  # the forward in progress, per thread (``.forward``)
        self.override: Optional[Callable] = None  # the override made with these plans (``override``)

    def valid_entries(self) -> dict:
        s = self.state
        settings, previous, generation = self.stamp
        if s.settings is not settings or s.previous_override is not previous or s.report.generation() != generation:
            self.entries.clear()
            self.stamp = (s.settings, s.previous_override, s.report.generation())
        return self.entries

    def learn(self, key: tuple, decisions: list, shapes: list) -> None:
        """Keep the plan the first forward of ``key`` showed: its calls' decisions (``PatchState.count``), and
        the shapes of its calls through the tensor entry."""
        events = [reason for _, reason in decisions]
        if REDO_REASON in events:  # a redone forward shows the guard's choice, not the dispatcher's
            return
        if any(route != COMFY for route, reason in decisions if reason is not None):
            plan = ForwardPlan(None, [], [])  # fallbacks not ComfyUI's attention as called: the dispatcher decides
        else:
            reasons = list(dict.fromkeys(e for e in events if e is not None))
            whole = None
            if None not in events:
                whole = {r: events.count(r) for r in reasons}
            calls = []
            if len(shapes) == len(events):  # one decision per call through the override (else: containers)
                for (q_shape, k_shape), event in zip(shapes, events, strict=True):
                    usable = event is not None and q_shape is not None
                    calls.append((q_shape, k_shape, reasons.index(event)) if usable else None)
            plan = ForwardPlan(whole, calls, reasons)
        put_bounded(self.entries, key, plan, MAX_PLANS)


def make_forward_wrapper(state: PatchState, plans: ForwardPlans) -> Callable:
    """A WrappersMP.APPLY_MODEL wrapper: finds or learns the forward's plan and runs the forward by it."""
    local = plans.local

    def sagetriton_forward_plan(executor, *args, **kwargs):
        topts = args[5] if len(args) > 5 else None
        # Ours as installed, not wrapped by another pack (taking it out would take their wrapper out too).
        # Training forwards too: their calls fall back for gradients, which says nothing of inference's.
        if (type(topts) is not dict or state.redo_reason is not None or getattr(local, "forward", None) is not None
                or topts.get(OVERRIDE_KEY) is not plans.override or torch.is_grad_enabled()):
            return executor(*args, **kwargs)  # not our forward's usual form, a redo, or a nested forward
        if state.sparse is not None:  # its calls change with the step and the layer; long-video forwards: few calls
            return executor(*args, **kwargs)
        s = state.settings
        full_precision = (s.full_precision_first_steps > 0 or s.full_precision_last_steps > 0) and \
            state.full_precision_step(topts)
        key = forward_key(args, kwargs, topts, full_precision)
        try:
            plan = plans.valid_entries().get(key)
        except TypeError:  # an unhashable input: no plan
            return executor(*args, **kwargs)
        if plan is not None and plan.whole is not None:
            bare = dict(topts)
            previous = state.previous_override
            if previous is None:
                del bare[OVERRIDE_KEY]
            else:
                bare[OVERRIDE_KEY] = previous
            out = executor(*args[:5], bare, *args[6:], **kwargs)
            state.runs.passed_through(plan.whole)
            return out
        forward = local.forward = _Forward(plan)
        try:
            out = executor(*args, **kwargs)
        finally:
            local.forward = None
            if plan is not None:
                for reason, n in zip(plan.reasons, forward.counts, strict=True):
                    if n:
                        state.runs.fallback(reason, n=n)
        if plan is None:
            plans.learn(key, forward.decisions, forward.shapes)
        return out

    return sagetriton_forward_plan
