"""What a user reads: messages that agree with each other, short tooltips, one figure per claim, one address."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def test_no_gpu_start_log_and_run_summary_tell_the_same_story(pack):
    """On a CPU install every call runs on ComfyUI's own attention: the start log, the run summary (log and
    node) must not say "nothing is patched" on one side and "replaced ComfyUI's attention" on the other."""
    from sagetriton.installer.firststart import NO_GPU_LOG
    from sagetriton.nodes.reporting.run_summary import format_summary

    own = "ComfyUI's global attention (sub_quad)"  # what describe_replaced names on a CPU ComfyUI
    summary = {"kernel": 0, "fallback": {"cpu device is not a CUDA/ROCm GPU": 4}, "fallback_total": 4,
               "config_text": "", "notes": [], "replaced": own, "fallback_backend": own, "backend": "SageTriton"}
    text = format_summary(summary)
    for said in (NO_GPU_LOG, text):
        assert "replaced" not in said and "nothing is patched" not in said, said
        assert "ComfyUI's" in said and "attention" in said, said
    assert text.endswith(f"fallbacks run on {own}"), text
    assert "every attention call to ComfyUI's own attention" in NO_GPU_LOG


def _tooltips():
    from sagetriton.nodes.ui.patch_node import SageTritonPatchModelAttention
    from sagetriton.nodes.ui.settings_node import SageTritonSettings

    for cls in (SageTritonSettings, SageTritonPatchModelAttention):
        for group in cls.INPUT_TYPES().values():
            for name, spec in group.items():
                if isinstance(spec, tuple) and len(spec) > 1 and isinstance(spec[1], dict) and "tooltip" in spec[1]:
                    yield name, spec[1]["tooltip"]
        for tip in cls.OUTPUT_TOOLTIPS:
            yield f"{cls.__name__} output", tip


def test_every_tooltip_fits_on_screen(pack):
    long = {name: len(tip) for name, tip in _tooltips() if len(tip) > 300}
    assert not long, f"tooltips over 300 characters (one claim each; figures go to docs/RESULTS.md): {long}"


FIGURE = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?(?:\s?%|x)?(?![\w.])")


def _figures(text: str) -> set[str]:
    return {f.replace(" ", "") for f in FIGURE.findall(text)}


def test_readme_settings_table_quotes_the_tooltips_figures(pack):
    """Each Sage Settings row of the README names the same figures as that input's tooltip (both come from
    nodes/ui/user_figures.py): no "1-5 %" in one place and "2-6 %" in the other."""
    tips = dict(_tooltips())
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `(\w+)` \|(.*)$", README.read_text(), re.M)}
    assert {"pv_precision", "qk_rotation"} <= set(rows), sorted(rows)
    for name, row in rows.items():
        if name in tips:
            assert _figures(row) <= _figures(tips[name]), (name, _figures(row), _figures(tips[name]))
    from sagetriton.nodes.ui.user_figures import PV_ERROR, QK_ROTATION_COST, QK_ROTATION_GAIN

    quoted = _figures(rows["pv_precision"] + rows["qk_rotation"])
    for figure in (*PV_ERROR.values(), QK_ROTATION_GAIN, QK_ROTATION_COST):
        assert figure.replace(" ", "") in quoted, figure


def _repository() -> str:
    found = re.findall(r'^Repository = "([^"]+)"$', (ROOT / "pyproject.toml").read_text(), re.M)
    assert len(found) == 1, found
    return found[0]


def test_one_repository_address_everywhere():
    """pyproject.toml, the About-page badge and the README's install commands name the same repository."""
    repo = _repository()
    assert re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+", repo), repo
    web = re.findall(r'const REPO = "([^"]+)"', (ROOT / "web" / "sagetriton.js").read_text())
    assert web == [repo], web
    readme = README.read_text()
    clones = re.findall(r"git clone (\S+)", readme)
    assert len(clones) >= 3 and set(clones) == {repo}, clones
    everywhere = set(re.findall(r"https://github\.com/[\w.-]+/ComfyUI-SageTriton\b", readme))
    assert everywhere == {repo}, everywhere


def test_readme_puts_the_user_first_and_stays_short():
    readme = README.read_text()
    assert len(readme.encode()) <= 10 * 1024, len(readme.encode())
    sections = re.findall(r"^## (.+)$", readme, re.M)
    assert sections[0] == "Install into ComfyUI" and sections.index("Run the tests (contributors)") > 3, sections
    install = readme.split("## Install into ComfyUI")[1].split("\n## ")[0]
    for python in (r"..\..\..\python_embeded\python.exe install.py", r"..\..\.venv\Scripts\python.exe install.py",
                   "../../venv/bin/python install.py"):
        assert python in install, python  # which Python runs install.py, on each kind of ComfyUI
    assert ".ci/run" not in install  # the contributor's 12 GB test setup is not part of installing
    tests = readme.split("## Run the tests (contributors)")[1].split("\n## ")[0]
    for cost in ("12 GB", "11-26 minutes", "up to 45 on a busy one", "Chromium", "COMFYUI_PATH",
                 "ComfyUI/custom_nodes/", "ci: N passed, N failed, N skipped"):
        assert cost in tests, cost
    # The fast part names the Python that has torch and pytest (the system one has neither).
    fast = re.findall(r"Fast part alone.*?`([^`]*pytest[^`]*)`", tests, re.S)
    assert fast == ['.venv-test/bin/python -m pytest -m "unit and not slow"'], fast


def test_readme_says_what_install_py_costs_and_how_it_exits():
    """The exit codes are tested in test_install.py (1 for a Python without torch, 0 otherwise); the README
    must not promise "never fails"."""
    readme = README.read_text()
    assert "never fails" not in readme
    assert "it exits 1 only under a Python without torch" in readme
    for cost in ("42 s on an idle CPU-only machine", "127 s on a busy one", "140 s on an H200", "a rerun takes seconds",
                 "37 MB", "~/.triton/cache"):
        assert cost in readme, cost


def test_user_facing_text_has_no_lab_words(pack):
    readme = README.read_text()
    tips = " ".join(tip for _, tip in _tooltips())
    for phrase in ("video forwards", "four floors", "An Inf in K", "2-6%", "Vue-nodes mode does not show"):
        assert phrase not in readme and phrase not in tips, phrase



def test_hostile_inputs_doc_says_each_thing_once_as_the_code_does(pack):
    """Issue 49 item 7: the table and "How the kernel stays exact" were there twice, the second copy with an older
    limit (2^16) and behaviour (rows worked out again), and a stray unfinished line between them."""
    import math

    from sagetriton.kernels.attention import HOT_LOGIT_LIMIT, HOT_LOGIT_LIMIT_FP8

    text = (ROOT / "docs" / "HOSTILE_INPUTS.md").read_text()
    headings = re.findall(r"^#+ .*$", text, re.M)
    rows = [ln for ln in text.splitlines() if ln.startswith("| ") and not ln.startswith("| Input")]
    assert len(headings) == len(set(headings)) and len(rows) == len(set(rows)), "a section or row is there twice"
    paragraphs = [p.strip() for p in text.split("\n\n") if p.strip() and not p.lstrip().startswith(("|", "#"))]
    assert all(len(p.split()) >= 8 for p in paragraphs), [p for p in paragraphs if len(p.split()) < 8]
    limits = re.findall(r"`HOT_LOGIT_LIMIT` \(2\^(\d+) in base 2, 2\^(\d+) for fp8 P\)", text)
    assert limits == [(str(int(math.log2(HOT_LOGIT_LIMIT.value))), str(int(math.log2(HOT_LOGIT_LIMIT_FP8.value))))]
    assert "made NaN" in text and "works its tiles out again" not in text
