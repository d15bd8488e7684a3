"""Fallback and "left dense" reasons are named members (``nodes/reporting/reasons.py``): the counters, log levels
and the run summary's hints match on the member, never on a reason's text, and the text shown is unchanged."""
import ast
import logging

import pytest
import torch
from attention_cases import comfy_args, random_qkv, reference_backend
from sagetriton.nodes.config.settings import SageSettings
from sagetriton.nodes.reporting import run_summary
from sagetriton.nodes.reporting.reasons import POLICY, TOO_SHORT, Because, Reason, reason_of
from sagetriton.nodes.reporting.stats import RunLog
from sagetriton.nodes.routing import dispatch, sparse_calls
from sagetriton.nodes.routing.dispatch import PatchState

from sagetriton_import import PACK_DIR


def test_no_reason_is_matched_by_its_text():
    """No ``startswith``/``endswith`` on anything named like a reason in the runtime: rewording a message must
    not change a log level or a hint."""
    found = []
    for path in sorted((PACK_DIR / "nodes").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("startswith", "endswith") and "reason" in ast.unparse(node).lower()):
                found.append(f"{path.relative_to(PACK_DIR)}:{node.lineno}: {ast.unparse(node)}")
    assert not found, found


def _override(state, q, k, v, mask=None, **extra):
    args = comfy_args(q, k, v, True)
    kwargs = dict(skip_reshape=True, skip_output_reshape=False, transformer_options={}, **extra)
    if mask is not None:
        kwargs["mask"] = mask
    return state.dispatch(reference_backend, (*args, q.shape[1]), kwargs)


CASES = [  # (settings, q/k/v options, call options, the text counted)
    (SageSettings(min_seq_len=0), {}, dict(low_precision_attention=False),
     "accuracy-critical call (low_precision_attention=False)"),
    (SageSettings(min_seq_len=0), {}, dict(window_size=4), "unsupported argument 'window_size'"),
    (SageSettings(min_seq_len=0), dict(dtype=torch.float32), {}, "dtype float32"),
    (SageSettings(min_seq_len=0), {}, dict(attn_precision=torch.float32), "fp32 attn_precision requested"),
    (SageSettings(min_seq_len=0), {}, dict(mask=torch.zeros(16, 16, dtype=torch.complex64)), "mask dtype complex64"),
    (SageSettings(min_seq_len=0), {}, dict(mask=torch.zeros(4, 16, 16)),
     "mask shape not broadcastable to (B, H, Lq, Lk)"),
    (SageSettings(min_seq_len=0), {}, dict(scale=float("nan")), "scale not a finite number"),
    (SageSettings(min_seq_len=17), {}, {}, "key length < 17"),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_every_counted_reason_is_a_member_with_its_old_text(case):
    settings, qkv, extra, text = CASES[case]
    state = PatchState(settings)
    state.begin_run()
    q, k, v = random_qkv(lq=16, lk=16, d=32, **qkv)
    _override(state, q, k, v, **extra)
    [(counted, n)] = state.run.fallback.items()
    assert counted == text and n == 1
    assert reason_of(counted) is not None, f"{counted!r} is counted as free text"


def test_sparse_left_dense_reasons_are_members():
    for reason in (sparse_calls.CROSS, sparse_calls.MASKED, sparse_calls.SMALL_HEADS, sparse_calls.DENSE_STEP,
                   sparse_calls.DENSE_LAYER, sparse_calls.FAILED, sparse_calls.short_reason(4096)):
        assert reason_of(reason) is not None, reason
    assert sparse_calls.short_reason(4096) == "< 4096 tokens" and sparse_calls.SMALL_HEADS == "head_dim < 64"
    assert dispatch.VARIANT_DISABLED == "kernel failed (variant disabled until restart)"


def test_log_level_and_unpatch_hint_follow_the_member_not_the_text(caplog):
    reworded = Because("calls too short here", Reason.KEY_TOO_SHORT)
    look_alike = "key length < 5"  # the old prefix, but no member: a problem, not policy
    runs = RunLog()
    runs.begin()
    with caplog.at_level(logging.INFO, logger="SageTriton"):
        runs.fallback(reworded)
        runs.fallback(look_alike)
    levels = {r.getMessage(): r.levelno for r in caplog.records}
    assert levels["[SageTriton] attention falls back (calls too short here)."] == logging.INFO
    assert levels["[SageTriton] attention falls back (key length < 5)."] == logging.WARNING
    summary = {"kernel": 0, "fallback": {reworded: 3}}
    assert run_summary.unpatch_hint(summary) == run_summary.UNPATCH_HINT
    assert run_summary.unpatch_hint({"kernel": 0, "fallback": {look_alike: 3}}) is None
    assert TOO_SHORT <= POLICY and str(Reason.DENSE_LAYER) == "dense layer" and f"{Reason.CROSS}" == "cross-attention"
