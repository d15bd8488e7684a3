"""The nodes' info panel: its words are the server's (nodes/reporting/panel_text.py), web/ draws them as sent.

The lines for each shape a status or run takes; no phrase spelled in both web/ and the pack's Python; and
web/sage_format.mjs (the module the page loads, run by node) shows whatever lines the server sends, verbatim.
"""
from __future__ import annotations

import ast
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from sagetriton.nodes.reporting.panel_text import mark_choices, run_alerts, run_lines, status_panel

from sagetriton_import import PACK_DIR

WHY = "sm86 has no fp8 matrix instructions; fp8 → fp16 on this GPU"
KEYED = {"arch": "sm86", "family": "ampere_consumer", "vendor": "nvidia", "crossover": {"seq_len": 1536},
         "defaults": {"64": {"qk_quant_gran": "per_block"},
                      "128": {"qk_quant_gran": "per_warp", "pv_precision": "fp16", "pv_accum_dtype": "fp16+fp32",
                              "min_seq_len": 1024}},
         "supported_choices": mark_choices({"pv_precision": {"fp8": {"ok": False, "why": WHY}}}),
         "backends": {"SageTriton": {"ok": True, "why": "", "short": ""},
                      "SageAttention": {"ok": False, "why": "not installed",
                                        "short": "SageAttention unavailable here → SageTriton"}}}
FLAT = {"arch": "gfx1201", "family": "rdna4", "vendor": "amd",
        "defaults": {"qk_quant_gran": "per_thread", "pv_precision": "fp8", "pv_accum_dtype": "fp32", "min_seq_len": 0},
        "supported_choices": {"pv_precision": {"fp8": {"ok": True, "why": ""}},
                              "qk_quant_gran": {"per_block": {"ok": False, "why": "x"}}},
        "setup": {"phase": "running", "message": "", "progress": {"done": 3, "total": 12}}}


def test_status_lines_for_each_route_shape():
    panel = status_panel(KEYED)
    assert panel["lines"] == ["SageTriton · sm86 · ampere_consumer · NVIDIA",
                              "defaults: QK per_warp · PV fp16 · fp16+fp32 acc", "kernel from 1536 tokens"]
    assert panel["settings"] == ["⚠ fp8 → fp16 on this GPU"]
    assert panel["backend"] == {"SageAttention": "⚠ SageAttention unavailable here → SageTriton"}
    assert panel["not_run"] == ["last run: none yet"] and panel["choices_title"] == "On this GPU (sm86):"
    flat = status_panel(FLAT)
    assert flat["lines"] == ["SageTriton · gfx1201 · rdna4 · AMD", "defaults: QK per_thread · PV fp8 · fp32 acc",
                             "kernel at any sequence length", "⏳ building and testing kernels 3/12"]
    assert flat["settings"] == ["⚠ per_block not supported on this GPU"]  # no "→" in the reason: said plainly
    assert mark_choices(FLAT["supported_choices"])["qk_quant_gran"]["per_block"]["short"] == \
        "per_block not supported on this GPU"
    # No GPU (or --cpu): min_seq_len 0 must not read as "kernel at any sequence length".
    cpu = status_panel({"arch": "cpu", "vendor": "cpu", "kernel_active": False,
                        "defaults": {"qk_quant_gran": "per_warp", "pv_precision": "fp16", "min_seq_len": 0}})
    assert cpu["lines"] == ["SageTriton · cpu", "defaults: QK per_warp · PV fp16",
                            "no GPU: ComfyUI's own attention runs"]
    failed = status_panel({"arch": "sm90", "setup": {"phase": "failed", "message": ""}, "report": {"invalid": "bad"}})
    assert failed["lines"] == ["SageTriton · sm90", "defaults: not reported yet",
                               "⚠ self-test failed: see the server log",
                               "⚠ self-test report ignored (bad); table defaults until it is redone"]


def test_run_lines_for_each_run_shape():
    assert run_lines(None) == ["last run: none yet"]
    assert run_lines({"kernel": 7, "fallback": {"a": 1, "b": 5, "c": 2, "d": 1}, "notes": [WHY]}) == [
        "last run: 7 kernel · 9 fallback", "5× b", "2× c", "1× a", "+1 more fallback reasons",
        "⚠ fp8 → fp16 on this GPU"]
    # What a patch replaced and what serves its fallbacks (nodes/core_backends.py), and the backend choice.
    assert run_lines({"kernel": 2, "fallback": {}, "backend": "SDPA",
                      "replaced": "comfy_kitchen_int8, set per model (Model Attention Backend node)",
                      "fallback_backend": "PyTorch SDPA (Sage Settings fallback=sdpa)"}) == [
        "last run: 2 kernel · 0 fallback", "kernel calls on SDPA (Sage Settings)",
        "took over from comfy_kitchen_int8, set per model (Model Attention Backend node) · "
        "fallbacks on PyTorch SDPA (Sage Settings fallback=sdpa)"]
    assert run_lines({"kernel": 1, "fallback": {}, "backend": "SageTriton", "replaced": "g", "fallback_backend": "g"}) \
        == ["last run: 1 kernel · 0 fallback", "fallbacks run on g"]
    assert run_lines({"kernel": 57, "fallback": {}, "rope": 57}) == \
        ["last run: 57 kernel · 0 fallback", "RoPE: 57 calls on SageTriton's kernel"]
    sparse = {"mode": "sol tau 1.3", "calls": 4, "density": 0.25, "dense": {"a": 1, "b": 3, "c": 2, "d": 1},
              "notes": ["sparse kernel failed"]}
    assert run_lines({"kernel": 4, "fallback": {}, "sparse": sparse})[1:] == [
        "sparse sol tau 1.3: 4 calls · 25.0 % blocks exact", "left dense: 3× b · 2× c · 1× a · +1 more",
        "⚠ sparse kernel failed"]
    assert run_lines({"kernel": 0, "fallback": {}, "sparse": {"off": "sparse off: no GPU"}})[1:] == \
        ["⚠ sparse off: no GPU"]
    outer = {"label": "Model Attention Backend", "calls": 8, "reached": 0, "ran_itself": 8, "ours_unused": True}
    assert run_lines({"kernel": 0, "fallback": {}, "outer": outer})[1:] == \
        ["⚠ not running: Model Attention Backend replaced it"]


def test_run_alerts_say_downgrades_and_kernel_failures_only():
    """Toasts follow the counted reason's member, never its wording: a reworded or look-alike text changes nothing."""
    from sagetriton.nodes.reporting.reasons import Reason

    alerts = run_alerts({"notes": [WHY], "fallback": {Reason.KEY_TOO_SHORT.of(4096): 6, Reason.VARIANT_DISABLED: 1,
                                                      Reason.REFUSED_ARGUMENTS: 2, Reason.SPARSE_FAILED: 1,
                                                      "kernel failed (variant disabled until restart)": 3}})
    assert [(a["severity"], a["key"]) for a in alerts] == [
        ("info", WHY), ("warn", Reason.VARIANT_DISABLED), ("warn", Reason.SPARSE_FAILED)]
    assert alerts[1]["detail"] == ("Attention fell back to ComfyUI's: kernel failed (variant disabled until "
                                   "restart). See the server log.")


# --- One source: no phrase in both places --------------------------------------------------------------

def js_literals(src: str) -> list:
    """The string literals of a JavaScript source, a template literal as its parts between ``${...}``."""
    out, n = [], len(src)

    def template(i: int) -> int:
        buf = ""
        while src[i] != "`":
            if src[i] == "\\":
                buf, i = buf + src[i:i + 2], i + 2
            elif src.startswith("${", i):
                out.append(buf)
                buf, i = "", code(i + 2, nested=True)
            else:
                buf, i = buf + src[i], i + 1
        out.append(buf)
        return i + 1

    def code(i: int, nested: bool = False) -> int:
        depth = 0
        while i < n:
            c = src[i]
            if src.startswith("//", i):
                i = src.find("\n", i) % (n + 1) if "\n" in src[i:] else n
                continue
            if src.startswith("/*", i):
                i = src.index("*/", i) + 2
                continue
            if c in "\"'":
                j = i + 1
                while src[j] != c:
                    j += 2 if src[j] == "\\" else 1
                out.append(src[i + 1:j])
                i = j + 1
                continue
            if c == "`":
                i = template(i + 1)
                continue
            if c == "{":
                depth += 1
            elif c == "}":
                if nested and depth == 0:
                    return i + 1
                depth -= 1
            i += 1
        return i

    code(0)
    return out


def python_strings(root: Path) -> list:
    """Every string constant of the pack's Python (f-strings' fixed parts too), tests and benchmarks aside."""
    out = []
    for path in [root / "__init__.py", *sorted((root / "nodes").rglob("*.py")),
                 *sorted((root / "kernels").rglob("*.py")), *sorted((root / "installer").rglob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                out.append(node.value)
    return out


def phrases(literal: str) -> list:
    """The wording in a literal: its parts between the panel's separators, with two words or more."""
    parts = (p.strip(" :;,.()·⚠×+") for p in literal.replace(" · ", "\n").replace("; ", "\n").splitlines())
    return [p for p in parts if len(p) >= 8 and " " in p and sum(ch.isalpha() for ch in p) >= 6]


def shared_phrases(js_sources: list, py_strings: list) -> set:
    return {p for src in js_sources for lit in js_literals(src) for p in phrases(lit)
            if any(p in s for s in py_strings)}


def test_no_phrase_is_worded_both_in_web_and_in_python():
    web = sorted((PACK_DIR / "web").glob("*.*js"))
    assert {p.name for p in web} >= {"sage_format.mjs", "sagetriton.js"}
    shared = shared_phrases([p.read_text(encoding="utf-8") for p in web], python_strings(PACK_DIR))
    assert not shared, f"worded in web/ and in the pack's Python (let the server send it): {sorted(shared)}"


def test_the_phrase_check_finds_a_phrase_worded_twice():
    """The check above can fail: the panel's old JavaScript, which composed the run summary's words itself."""
    js = ("export function fallbackLine(replaced, fb) {\n  // what runs the fallbacks\n"
          "  return fb && fb !== replaced ? `took over from ${replaced} · fallbacks on ${fb}` "
          ": `fallbacks run on ${replaced}`;\n}\nconst s = 'RoPE: ComfyUI\\'s, compiled by torch.compile';\n")
    assert js_literals(js)[:3] == ["took over from ", " · fallbacks on ", ""]
    shared = shared_phrases([js], python_strings(PACK_DIR))
    assert {"took over from", "fallbacks on", "fallbacks run on"} <= shared, shared


# --- The page's module draws the server's lines as sent ------------------------------------------------

def run_node_module(script: str, *args: str):
    if shutil.which("node") is None:
        pytest.skip("needs node")
    module = (PACK_DIR / "web" / "sage_format.mjs").as_uri()
    proc = subprocess.run(["node", "--input-type=module", "-e", f"import * as m from '{module}';" + script, *args],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_the_page_shows_the_servers_lines_verbatim():
    # Lines no formatter would make: anything the page shows must have come from the server as sent.
    status = {"arch": "sm86", "panel": {"lines": ["first «line»", "second"], "settings": ["⚠ s1", "s2"],
                                        "backend": {"SageAttention": "⚠ b"}, "not_run": ["never ran"]},
              "supported_choices": mark_choices(KEYED["supported_choices"])}
    run = {"kernel": 3, "fallback": {"x": 1}, "lines": ["ran «3»", "⚠ w"]}
    out = run_node_module(
        "const [s, r] = process.argv.slice(1).map(JSON.parse); console.log(JSON.stringify({"
        " settings: m.infoLines(m.SETTINGS_NODE, s, null, 'SageAttention'),"
        " settingsOk: m.infoLines(m.SETTINGS_NODE, s, null, 'SageTriton'),"
        " fresh: m.infoLines(m.PATCH_NODE, s), ran: m.infoLines(m.PATCH_NODE, s, r),"
        " loading: m.infoLines(m.PATCH_NODE, undefined), missing: m.infoLines(m.PATCH_NODE, null),"
        " marks: m.unsupportedChoices(s), label: m.labelMark('fp8 → fp16 on this GPU')}));",
        json.dumps(status), json.dumps(run))
    assert out["settings"] == ["first «line»", "second", "⚠ s1", "s2", "⚠ b"]
    assert out["settingsOk"] == ["first «line»", "second", "⚠ s1", "s2"]
    assert out["fresh"] == ["first «line»", "second", "never ran"]
    assert out["ran"] == ["first «line»", "second", "ran «3»", "⚠ w"]
    assert out["loading"] == ["SageTriton · loading…"] and out["missing"] == ["SageTriton · status unavailable"]
    assert out["marks"] == {"pv_precision": {"fp8": {"why": WHY, "short": "fp8 → fp16 on this GPU"}}}
    assert out["label"] == "⚠ → fp16"
    # And the server's own lines for a real status shape go through unchanged.
    real = {**KEYED, "panel": status_panel(KEYED)}
    shown = run_node_module("console.log(JSON.stringify(m.infoLines(m.SETTINGS_NODE, JSON.parse(process.argv[1]),"
                            " null, 'SageAttention')));", json.dumps(real))
    assert shown == real["panel"]["lines"] + real["panel"]["settings"] + [real["panel"]["backend"]["SageAttention"]]
