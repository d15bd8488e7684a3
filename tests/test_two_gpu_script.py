"""bench/two_gpu.py (issue 53, run on two H200s) kept runnable: its sequence-parallel and thread parts on the
CPU (``--cpu-smoke``: gloo ranks, the Triton interpreter, tiny shapes), through the same code as on the GPUs."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from sagetriton_import import PACK_DIR


def test_two_gpu_script_runs_its_parts_on_the_cpu():
    if importlib.util.find_spec("yunchang") is None:  # looked up, not imported (see test_engines.needs)
        pytest.skip("yunchang is not installed (.ci/run installs it into the pinned leg)")
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(PACK_DIR / "bench" / "two_gpu.py"), "--cpu-smoke"], capture_output=True,
                          text=True, timeout=900, env=env, cwd=str(PACK_DIR / "bench"))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-5000:]
    result = json.loads(lines[-1][len("RESULT "):])
    sp = {(r["mode"], r["type"]): r for r in result["sp"]}
    assert len(sp) == 10 and all(r["ok"] for r in sp.values()), sp
    assert all(sp[("ulysses 2", t)]["cos"] == 1.0 for t in ("SAGE_AUTO", "SAGE_FP8"))  # heads split: same calls
    threads = result["threads"]
    assert [r["same_as_alone"] for r in threads[:2]] == [True, True] and threads[2]["ok"], threads
    assert threads[2]["recording_threads"] == 2  # each thread replays its own recordings
