"""Step detection for full-precision steps, and the settings' validation (no ComfyUI needed)."""
import pytest
import torch
from sagetriton.nodes.config.settings import SageSettings
from sagetriton.nodes.routing.schedule import is_full_precision_step, step_position

SCHEDULE = torch.tensor([14.6, 6.0, 2.5, 0.9, 0.0])  # 4 steps


def opts(sigma):
    return {"sample_sigmas": SCHEDULE, "sigmas": torch.tensor([sigma, sigma])}


@pytest.mark.parametrize("sigma,index", [(14.6, 0), (6.0, 1), (2.5, 2), (0.9, 3),
                                         (4.0, 1),  # a second-order sampler's midpoint belongs to its step
                                         (20.0, 0), (0.0, 3)])
def test_step_position(sigma, index):
    assert step_position(opts(sigma)) == (index, 4)


def test_step_position_unknown_without_sampler_keys():
    assert step_position({}) is None
    assert step_position({"sample_sigmas": SCHEDULE}) is None
    assert step_position({"sample_sigmas": torch.tensor([1.0]), "sigmas": torch.tensor([1.0])}) is None


def test_full_precision_steps():
    flags = [is_full_precision_step(opts(float(s)), 1, 2) for s in SCHEDULE[:-1]]
    assert flags == [True, False, True, True]
    assert not any(is_full_precision_step(opts(float(s)), 0, 0) for s in SCHEDULE)
    assert not is_full_precision_step({}, 3, 3)  # outside a sampler: never forced


@pytest.mark.parametrize("bad", [dict(qk_quant_gran="per_row"), dict(pv_precision="fp4"), dict(fallback="xformers"),
                                 dict(pv_accum_dtype="bf16"), dict(min_seq_len=-2),
                                 dict(full_precision_last_steps=-1)])
def test_settings_reject_invalid_values(bad):
    with pytest.raises(ValueError, match="Sage Settings"):
        SageSettings(**bad)


def test_settings_auto_means_table_default():
    s = SageSettings(pv_precision="fp8")
    assert s.explicit_kernel_choices() == {"qk_quant_gran": None, "pv_precision": "fp8", "pv_accum_dtype": None,
                                           "qk_rotation": None}
    assert SageSettings(qk_rotation="on").explicit_kernel_choices()["qk_rotation"] is True
