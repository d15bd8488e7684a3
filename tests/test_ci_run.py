"""`.ci/run` installs only into its own virtual environment, never into the Python that runs it, and says
what it ran: a labelled line per test step and one closing line of totals (.ci/steps.sh)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
STEPS = ROOT / ".ci" / "steps.sh"


def _freeze(python) -> str:
    return subprocess.run([str(python), "-m", "pip", "freeze", "--all"], capture_output=True, text=True,
                          check=True).stdout


def _setup(env: dict) -> str:
    r = subprocess.run(["bash", str(ROOT / ".ci" / "run"), "--setup-only"], env=env, capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


@pytest.mark.slow  # creates a virtual environment and runs pip a few times
def test_setup_installs_only_into_its_own_environment(tmp_path):
    # "python" and "python3" on PATH are this interpreter, logging each command line they run.
    real, calls, bin_dir = Path(sys.executable), tmp_path / "calls.log", tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("python", "python3"):
        (bin_dir / name).write_text(f'#!/bin/sh\necho "$*" >> "{calls}"\nexec "{real}" "$@"\n')
        (bin_dir / name).chmod(0o755)
    venv = tmp_path / "venv"
    # The calling Python's packages (read-only) and no index: the packages already here are found, nothing
    # is downloaded, and anything installed would have to land in the new environment. This interpreter
    # is usually a venv itself, whose base Python has no torch: the new one must see this one's packages.
    # No ComfyUI where the script looks (COMFYUI_PATH empty, another home): it says so first.
    home = tmp_path / "home"
    home.mkdir()
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", SAGETRITON_TEST_VENV=str(venv),
               SAGETRITON_TEST_VENV_SYSTEM_SITE="1", PIP_NO_INDEX="1", COMFYUI_PATH="", HOME=str(home))
    before = _freeze(real)
    out = _setup(env).splitlines()
    made = calls.read_text().splitlines()
    assert made[0] == f"-m venv --without-pip {venv}" and len(made) == 2 and made[1].startswith("-c "), made
    assert _freeze(real) == before
    found = subprocess.run([venv / "bin" / "python", "-c", "import torch, pytest, pytest_timeout, selenium, ruff, tqdm;"
                            " print(torch.__file__)"], check=True, capture_output=True, text=True).stdout
    assert Path(found.strip()).is_relative_to(Path(torch_dir()).parent), found
    assert out[0].startswith("ci: pinned leg (set-up)") and out[1].startswith("creating the test environment")
    assert out[2].startswith("NOTE: no ComfyUI checkout found: the tests use ComfyUI 0.3.75 from PyPI"), out
    # A later run reuses the environment: the calling interpreter is not run at all.
    calls.unlink()
    _setup(env)
    assert not calls.exists()


def torch_dir() -> str:
    import torch

    return str(Path(torch.__file__).parent)


# The CI judge's plain closing line: "N passed, N failed" alone on a line, one word and a colon before it.
VERDICT = re.compile(r"^(\w+: )?\d+ passed, \d+ failed(, \d+ skipped)?$")


def _ci(tmp_path, body: str) -> subprocess.CompletedProcess:
    """``body`` run as .ci/run runs its steps: bash with -euo pipefail, steps.sh sourced, the EXIT trap set."""
    for name, code in {"good": "import pytest\n\ndef test_a():\n    pass\n\ndef test_b():\n    pass\n\n"
                                 "def test_c():\n    pytest.skip('not here')\n",
                       "bad": "def test_a():\n    pass\n\ndef test_b():\n    assert 1 == 2\n"}.items():
        (tmp_path / name).mkdir(exist_ok=True)
        (tmp_path / name / f"test_{name}.py").write_text(code)
    (tmp_path / "empty").mkdir(exist_ok=True)
    script = (f"set -euo pipefail\nsource {STEPS}\ntrap 'ci_on_exit $?' EXIT\n"
              f"PYTEST=({sys.executable} -m pytest -q -p no:cacheprovider)\n{body}")
    return subprocess.run(["bash", "-c", script], cwd=str(tmp_path), capture_output=True, text=True, timeout=300)


def test_each_step_is_labelled_and_the_run_ends_with_one_verdict_line(tmp_path):
    r = _ci(tmp_path, """
ci_step "leg A 1/2, good tests" "${PYTEST[@]}" good
ci_step "leg A 2/2, lint" false
ci_step "leg B 1/2, a failing test" "${PYTEST[@]}" bad
ci_step "leg B 2/2, nothing collected" "${PYTEST[@]}" empty
ci_verdict
""")
    lines = r.stdout.splitlines()
    assert r.returncode == 1, r.stdout + r.stderr  # a failing step fails the run; every step still ran
    assert lines[-1] == "ci: 3 passed, 2 failed, 1 skipped", lines[-6:]
    assert [line for line in lines if VERDICT.match(line)] == [lines[-1]], lines  # the only closing line
    steps = [line for line in lines if line.startswith("ci step: ")]
    assert steps[-4:] == ["ci step: leg A 1/2, good tests: passed 2, failed 0, skipped 1 (ok)",
                          "ci step: leg A 2/2, lint: passed 0, failed 1, skipped 0 (exit 1)",
                          "ci step: leg B 1/2, a failing test: passed 1, failed 1, skipped 0 (exit 1)",
                          "ci step: leg B 2/2, nothing collected: passed 0, failed 0, skipped 0 "
                          "(pytest collected no test (exit 5))"], steps
    assert "ci: leg A 1/2, good tests" in lines  # said before the step's own output


def test_a_passing_run_exits_zero_and_one_that_ran_no_test_does_not(tmp_path):
    ok = _ci(tmp_path, 'ci_step "only step" "${PYTEST[@]}" good\nci_step "none" "${PYTEST[@]}" empty\nci_verdict\n')
    assert ok.returncode == 0 and ok.stdout.splitlines()[-1] == "ci: 2 passed, 0 failed, 1 skipped", ok.stdout
    none = _ci(tmp_path, 'ci_step "none" "${PYTEST[@]}" empty\nci_verdict\n')
    assert none.returncode == 1 and none.stdout.splitlines()[-1] == "ci: 0 passed, 1 failed, 0 skipped", none.stdout
    assert "no step ran a test" in none.stdout


def test_a_setup_failure_still_ends_with_the_verdict_naming_where_it_stopped(tmp_path):
    r = _ci(tmp_path, 'ci_step "first" "${PYTEST[@]}" good\nci_say "newest leg (set-up): torch"\nfalse\n'
                      'ci_step "never" "${PYTEST[@]}" good\nci_verdict\n')
    lines = r.stdout.splitlines()
    assert r.returncode == 1, r.stdout + r.stderr
    assert lines[-1] == "ci: 2 passed, 1 failed, 1 skipped", lines
    assert "ci step: stopped (exit 1) while: newest leg (set-up): torch: passed 0, failed 1, skipped 0" in lines
    assert not any("never" in line for line in lines)


def test_ci_run_labels_its_steps_and_gives_the_newest_leg_the_newest_frontend():
    """By reading .ci/run (running it takes an hour and downloads GBs): every test command goes through
    ci_step, both environments get the newest frontend, each leg has its own screenshot folder, and the
    script ends with the verdict."""
    text = (ROOT / ".ci" / "run").read_text()
    code = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    assert code[-1] == "ci_verdict", code[-3:]
    assert "source .ci/steps.sh" in code and "trap 'ci_on_exit $?' EXIT" in code
    runs = [line for line in code if re.search(r"-m (pytest|ruff)\b", line)]
    assert runs and all("ci_step" in line or line.startswith('"$NPY" -m pytest') for line in runs), runs
    assert 'newest_frontend "$VPY" "$VENV"' in code
    assert any(line.endswith('newest_frontend "$NPY" "$NEWEST_VENV"') for line in code), code
    assert text.count("SAGETRITON_ARTIFACTS=tests/artifacts/pinned") == 1
    assert text.count("SAGETRITON_ARTIFACTS=tests/artifacts/newest") == 1
    # What the newest leg runs is said before its torch download.
    said = text.index('ci_say "newest leg (set-up)')
    assert said < text.index('-m pip install -q -U "${SAGETRITON_NEWEST_TORCH')
