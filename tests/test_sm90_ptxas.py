"""Which ptxas builds the Hopper Gluon kernels: a CUDA 12 one on every Triton (3.9 would take its CUDA 13
``ptxas-blackwell`` for sm90; bench/NOTES.md, "Triton 3.9: why the Gluon kernel is slower")."""
from __future__ import annotations

import os

import pytest

triton = pytest.importorskip("triton")
compiler = pytest.importorskip("triton.backends.nvidia.compiler")

from sagetriton.kernels import triton_compat  # noqa: E402


def sm90_tool():
    return compiler.get_ptxas(90)


def test_gluon_builds_assemble_sm90_with_a_cuda12_ptxas():
    outside = sm90_tool().version
    with triton_compat.sm90_ptxas_scope():
        inside = sm90_tool().version
        ptx = compiler.get_ptx_version_from_options(compiler.CUDAOptions(), 90)
    assert inside.startswith("12."), (triton.__version__, inside)
    assert ptx < 90, ptx  # the PTX is written for that ptxas
    assert sm90_tool().version == outside  # builds outside the block are Triton's own
    if outside.startswith("12."):  # 3.8 and older: nothing to change
        assert triton_compat.sm90_ptxas() is None


def test_scope_restores_what_the_user_set(monkeypatch):
    legacy = triton.knobs.nvidia.ptxas.path
    monkeypatch.setenv(triton_compat.BLACKWELL_PTXAS_KNOB, "/nonexistent/ptxas-blackwell")
    with triton_compat.sm90_ptxas_scope(legacy):
        assert os.environ[triton_compat.BLACKWELL_PTXAS_KNOB] == legacy
    assert os.environ[triton_compat.BLACKWELL_PTXAS_KNOB] == "/nonexistent/ptxas-blackwell"
