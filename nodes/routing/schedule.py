"""Which sampling step an attention call belongs to (for full-precision first/last steps).

The sampler puts the whole schedule in ``transformer_options["sample_sigmas"]`` (steps + 1 values,
decreasing, usually ending at 0) and the current noise level in ``transformer_options["sigmas"]``
(one per batch item). Multi-evaluation samplers (Heun, DPM++ 2S, ...) also evaluate the model at
sigmas between two schedule points: those belong to the step whose interval contains them.
"""
from __future__ import annotations

from typing import Optional


def step_position(transformer_options: dict) -> Optional[tuple[int, int]]:
    """(step index, number of steps) of the current model call, or None when unknown."""
    schedule = transformer_options.get("sample_sigmas")
    current = transformer_options.get("sigmas")
    if schedule is None or current is None:
        return None
    try:
        values = [float(s) for s in schedule.flatten().tolist()]
        sigma = float(current.flatten()[0])
    except (AttributeError, TypeError, ValueError, IndexError):
        return None
    steps = len(values) - 1
    if steps < 1:
        return None
    return _interval_index(values, sigma), steps


def _interval_index(schedule: list[float], sigma: float) -> int:
    steps = len(schedule) - 1
    # Exact (or nearly exact) schedule points first: most samplers evaluate exactly there.
    for i in range(steps):
        if abs(schedule[i] - sigma) <= 1e-4 * max(abs(schedule[i]), 1e-8):
            return i
    descending = schedule[0] >= schedule[-1]
    for i in range(steps):
        hi, lo = (schedule[i], schedule[i + 1]) if descending else (schedule[i + 1], schedule[i])
        if lo <= sigma <= hi:
            return i
    # Outside the schedule: clamp to the nearer end.
    return 0 if abs(sigma - schedule[0]) <= abs(sigma - schedule[-1]) else steps - 1


def is_full_precision_step(transformer_options: dict, first_steps: int, last_steps: int) -> bool:
    """True when the current call falls in the first ``first_steps`` or last ``last_steps`` steps."""
    if first_steps <= 0 and last_steps <= 0:
        return False
    position = step_position(transformer_options)
    if position is None:
        return False
    index, steps = position
    return index < first_steps or index >= steps - last_steps
