"""bench/gpu_check.py on a real GPU: every kernel feature compiled and checked against fp64.

The rest of the suite runs the kernels through the Triton interpreter; this runs the compiled code,
in a child process without ``TRITON_INTERPRET`` (the tests' own process has it set). Skipped without
a GPU: ``pytest -m gpu`` on a GPU machine.
"""
import os
import subprocess
import sys

import pytest
import torch

from sagetriton_import import PACK_DIR

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm GPU")]


def test_gpu_check_passes_every_case():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, str(PACK_DIR / "bench" / "gpu_check.py")], capture_output=True, text=True,
                          env=env, timeout=1800)
    print(proc.stdout)
    bad = [line for line in proc.stdout.splitlines() if line.startswith("BAD")]
    assert proc.returncode == 0 and not bad, "\n".join(bad) or proc.stderr[-3000:]
