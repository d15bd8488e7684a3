"""End-to-end in a real headless browser: ComfyUI's frontend with the SageTriton extension loaded.

Debian's chromium + chromedriver (installed by .ci/run), driven by selenium. Screenshots go to
tests/artifacts/ (git-ignored), or to $SAGETRITON_ARTIFACTS (.ci/run: tests/artifacts/pinned and
tests/artifacts/newest, one folder per leg). The README's picture, docs/img/nodes.png, is a copy of
the pinned leg's nodes.png, and the template browser's thumbnails, workflows/<name>.jpg, are copies of
its <name>.jpg.
"""
from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import tempfile
import time
from pathlib import Path

import pytest
from e2e_server import PACK_LINK, TINY_MODEL, cpu_install_server, flat_defaults, sage_server  # noqa: F401 (fixture)
from sagetriton.nodes.reporting.panel_text import mark_choices, run_alerts, run_lines, status_panel

from conftest import needs_comfyui

pytestmark = [needs_comfyui, pytest.mark.server, pytest.mark.browser]

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / (os.environ.get("SAGETRITON_ARTIFACTS") or "tests/artifacts")  # relative: to the checkout
CHROMEDRIVER = "/usr/bin/chromedriver"
EXT_NAME = "SageTriton.NodeInfo"


@pytest.fixture(scope="module")
def driver(sage_server):  # noqa: F811
    yield from _browser(sage_server)


# What a user without a GPU sees (no Triton interpreter), on the frontend ComfyUI's requirements pin (1.27
# for 0.3.64, 1.32 for 0.3.75) and on the newest from PyPI (1.58): the pictures (README, template
# thumbnails) come from the pinned one; the examples must open cleanly on both.
@pytest.fixture(scope="module", params=["pinned", "newest"])
def cpu_driver(comfyui_path, request):
    server = cpu_install_server(comfyui_path, request, request.param)
    for drv in _browser(server):
        drv.sage_frontend, drv.sage_server = request.param, server
        yield drv


def _browser(server):
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    if os.environ.get("SAGETRITON_NO_BROWSER"):  # set by .ci/run where it could not install chromium
        pytest.skip(os.environ["SAGETRITON_NO_BROWSER"])
    if not Path(CHROMEDRIVER).exists():
        pytest.skip("chromium-driver not installed (apt-get install chromium chromium-driver)")
    profile = tempfile.mkdtemp(prefix="sagetriton-chromium-")
    opts = webdriver.ChromeOptions()
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
                 "--no-first-run", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--window-size=1600,1000", f"--user-data-dir={profile}"):
        opts.add_argument(flag)
    drv = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    drv.set_script_timeout(120)
    # Frontend 1.32's "Introducing Nodes 2.0" banner over the top of the canvas, dismissed as a user would
    # (the frontend keeps that in localStorage), before the page's own scripts run.
    drv.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument",
                        {"source": "try { localStorage.setItem('vueNodesBannerDismissed', 'true'); } catch (e) {}"})
    try:
        drv.get(server.url)
        _wait(drv, "return !!(window.app && app.graph && app.canvas && app.extensions && "
                   f"app.extensions.some(e => e.name === '{EXT_NAME}'))", 90, "frontend with the extension")
        drv.sage_frontend_version = drv.execute_script("return window.__COMFYUI_FRONTEND_VERSION__ ?? null")
        yield drv
    finally:
        drv.quit()
        shutil.rmtree(profile, ignore_errors=True)


def _wait(drv, script: str, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = drv.execute_script(script)
        if last:
            return last
        time.sleep(0.25)
    logs = drv.get_log("browser") if hasattr(drv, "get_log") else []
    raise AssertionError(f"timed out waiting for {what} (last={last!r}); browser log: {logs[-20:]}")


def _wait_clicking(drv, click: str, done: str, timeout: float, what: str, every: float = 5.0):
    """_wait for ``done`` (a script body that returns), running ``click`` again every ``every`` s until then.
    A click that lands while a dialog mounts is lost (its default selection replaces it): a person clicks again."""
    drv.execute_script("window.__sageClicked = Date.now()")  # the caller's own click, just made
    return _wait(drv, f"const r = (() => {{ {done} }})(); if (r) return r;"
                      f"if (Date.now() - window.__sageClicked > {round(every * 1000)}) {{"
                      f" window.__sageClicked = Date.now(); {click} }} return r;", timeout, what)


def _shot(drv, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / name
    drv.save_screenshot(str(path))
    return path


# Test code only: builds a graph through LiteGraph, reads widgets back. Returns node ids by role.
BUILD_GRAPH = """
const [tiny, seed] = arguments;
app.graph.clear();
const add = (type, pos, values = {}) => {
  const n = LiteGraph.createNode(type);
  n.pos = pos;
  app.graph.add(n);
  for (const [k, v] of Object.entries(values)) n.widgets.find(w => w.name === k).value = v;
  return n;
};
const unet = add("UNETLoader", [20, 40], {unet_name: tiny});
const settings = add("SageTritonSettings", [20, 200], {min_seq_len: 0});
const patch = add("SageTritonPatchModelAttention", [430, 40]);
const cond = add("SageTritonE2ETinyConditioning", [430, 330]);
const latent = add("EmptyHunyuanLatentVideo", [430, 520], {width: 64, height: 64, length: 1});
const ks = add("KSampler", [840, 40], {steps: 1, cfg: 1.0, seed});
const save = add("SaveLatent", [840, 560], {filename_prefix: "sagetriton_e2e_browser"});
unet.connect(0, patch, 0); settings.connect(0, patch, 1); patch.connect(0, ks, 0);
cond.connect(0, ks, 1); cond.connect(0, ks, 2); latent.connect(0, ks, 3); ks.connect(0, save, 0);
app.canvas.ds.scale = 1; app.canvas.ds.offset = [20, 20];
app.graph.setDirtyCanvas(true, true);
return {settings: settings.id, patch: patch.id};
"""

READ_NODE = """
const n = app.graph.getNodeById(arguments[0]);
const info = n.widgets.find(w => w.name === "sagetriton_info");
const widgets = Object.fromEntries(n.widgets.map(w => [w.name, {value: w.value, label: w.label ?? null,
                                                                 tooltip: w.tooltip ?? null}]));
return {lines: info ? info.lines : null, hidden: info ? !!info.hidden : null, widgets, size: Array.from(n.size)};
"""


def _wait_panel(driver, node_id, text: str, what: str):
    _wait(driver, f"const n = app.graph.getNodeById({node_id});"
                  "const w = n.widgets.find(w => w.name === 'sagetriton_info');"
                  f"return !!w && w.lines.some(l => l.includes({json.dumps(text)}))", 30, what)


def _refetch_status(driver):
    # The extension refetches /sage/status after each prompt: fake the end of one.
    driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "import('/scripts/api.js').then(({api}) => {"
        " api.dispatchEvent(new CustomEvent('execution_success', {detail: {}})); done(true); });")


# An sm80 (Ampere: no fp8 matrix units) as the route would describe it. The CPU test "arch" runs
# every choice through the interpreter, so marking is checked against this simulated GPU.
AMPERE_WHY = "sm80 has no fp8 matrix instructions; fp8 → fp16 on this GPU"


def ampere_status(status: dict) -> dict:
    """``status`` as the route would answer on an sm80 (no fp8), its panel and run lines made by the server's code."""
    s = {**status, "arch": "sm80", "family": "ampere", "vendor": "nvidia", "kernel_active": True, "note": ""}
    s["supported_choices"] = mark_choices({**s["supported_choices"], "pv_precision": {
        **s["supported_choices"]["pv_precision"], "fp8": {"ok": False, "why": AMPERE_WHY}}})
    run = {**(s.get("last_run") or {"kernel": 0, "fallback": {}}), "notes": [AMPERE_WHY]}
    s["last_run"] = {**run, "lines": run_lines(run), "alerts": run_alerts(run)}
    s["panel"] = status_panel(s)
    return s


@contextlib.contextmanager
def simulated_ampere(driver, server):
    """Test-only: the page sees /sage/status answer as an sm80 with no fp8 would."""
    _, status = server.get("/sage/status")
    driver.execute_script(
        "const body = arguments[0]; window.__sageRealFetch = window.fetch;"
        "window.fetch = (url, opts) => !String(url).includes('/sage/status') ? window.__sageRealFetch(url, opts)"
        " : Promise.resolve(new Response(body, {headers: {'Content-Type': 'application/json'}}));",
        json.dumps(ampere_status(status)))
    _refetch_status(driver)
    try:
        yield
    finally:
        driver.execute_script("window.fetch = window.__sageRealFetch;")
        _refetch_status(driver)


def _pick(driver, node_id, option: str, value: str):
    """Select ``value`` as the user would (value + callback); returns the widget's label."""
    return driver.execute_script(
        f"const n = app.graph.getNodeById({node_id}); const w = n.widgets.find(w => w.name === arguments[0]);"
        " w.value = arguments[1]; w.callback?.(w.value, app.canvas, n); return w.label ?? null;", option, value)


def test_nodes_show_gpu_and_defaults_from_the_server(driver, sage_server):  # noqa: F811
    _, status = sage_server.get("/sage/status")
    ids = driver.execute_script(BUILD_GRAPH, TINY_MODEL, random.randrange(2**31))
    _wait_panel(driver, ids["settings"], f"SageTriton · {status['arch']}", "the info panel")
    settings = driver.execute_script(READ_NODE, ids["settings"])
    patch = driver.execute_script(READ_NODE, ids["patch"])
    panel = status["panel"]  # the server's lines, drawn as sent
    for node in (settings, patch):
        assert node["lines"][0].startswith(f"SageTriton · {status['arch']}")
        assert node["lines"][:len(panel["lines"])] == panel["lines"], (node["lines"], panel)
        assert f"PV {flat_defaults(status)['pv_precision']}" in node["lines"][1]
        if not status["kernel_active"]:  # this machine: no GPU, so the node must not promise the kernel
            assert node["lines"][2] == "no GPU: ComfyUI's own attention runs"
        assert node["hidden"] is False
    # A fresh node has not run: whatever ran on the server before (other tests' prompts) is not its run.
    assert patch["lines"] == panel["lines"] + ["last run: none yet"], patch["lines"]
    # Whatever the server says this GPU cannot run is marked (on the CPU "arch": nothing), as it says it.
    assert settings["lines"] == panel["lines"] + panel["settings"], settings["lines"]
    _shot(driver, "sagetriton_nodes.png")


# Test code only: the top-left corner of the canvas area that the frontend's own panels (1.58's sidebar
# and top bar lie over the canvas) leave free, in page pixels.
FREE_CORNER = """
const cv = app.canvas.canvas, r = cv.getBoundingClientRect();
const clear = (x, y) => document.elementFromPoint(x, y) === cv;
let left = r.left, top = r.top;
while (left < r.left + r.width / 2 && !clear(left + 1, r.top + r.height / 2)) left += 4;  // a sidebar
// A top bar, and buttons floating under it: the first row clear over the picture's width.
const row = y => { for (let x = left + 1; x < left + 1000; x += 4) if (!clear(x, y)) return false; return true; };
while (top < r.top + r.height / 2 && !(row(top + 1) && row(top + 20))) top += 4;
const free = [left - r.left, top - r.top];
"""

# The README's picture: the two nodes wired as a user would, nothing from the tests in the graph.
README_GRAPH = """
app.graph.clear();
""" + FREE_CORNER + """
const add = (type, pos) => { const n = LiteGraph.createNode(type); n.pos = pos; app.graph.add(n); return n; };
// Sage Settings (the tallest, sparse options included) on the left from the top; the model line beside it.
const settings = add("SageTritonSettings", [20, 40]);
const unet = add("UNETLoader", [420, 40]);
const patch = add("SageTritonPatchModelAttention", [420, 200]);
const ks = add("KSampler", [820, 40]);
unet.connect(0, patch, 0); settings.connect(0, patch, 1); patch.connect(0, ks, 0);
// Scaled down only if the graph would not fit the free area (room for the badges above the nodes).
const bottom = Math.max(...app.graph.nodes.map(n => n.pos[1] + n.size[1])) + 40;
const right = Math.max(...app.graph.nodes.map(n => n.pos[0] + n.size[0])) + 40;
const s = Math.min(1, (cv.getBoundingClientRect().height - free[1] - 25) / bottom,
                   (cv.getBoundingClientRect().width - free[0] - 10) / right);
app.canvas.ds.scale = s; app.canvas.ds.offset = [(free[0] + 10) / s, (free[1] + 25) / s];
app.graph.setDirtyCanvas(true, true);
return {settings: settings.id, free: free, scale: s};
"""

# Test code only: every node's corners (title bar included) as the page shows them: each must be the
# canvas, or the node's own text box; anything else lies over the node (a sidebar, a banner, a toast),
# or the corner is outside the window.
HIDDEN_CORNERS = """
const cv = app.canvas.canvas, r = cv.getBoundingClientRect(), ds = app.canvas.ds;
const title = LiteGraph.NODE_TITLE_HEIGHT ?? 30;
const page = (x, y) => [r.left + (x + ds.offset[0]) * ds.scale, r.top + (y + ds.offset[1]) * ds.scale];
const cls = e => typeof e.className === 'string' ? e.className.trim().split(/\\s+/).slice(0, 3).join('.') : '';
const named = e => !e ? 'outside the window' : e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') + '.' + cls(e);
const own = e => e === cv || (e?.tagName === 'TEXTAREA');
return app.graph.nodes.flatMap(n => {
  const [x0, y0] = page(n.pos[0], n.pos[1] - title), [x1, y1] = page(n.pos[0] + n.size[0], n.pos[1] + n.size[1]);
  return [[x0 + 4, y0 + 4], [x1 - 4, y0 + 4], [x0 + 4, y1 - 4], [x1 - 4, y1 - 4]]
    .map(([x, y]) => [Math.round(x), Math.round(y), document.elementFromPoint(x, y)])
    .filter(([, , e]) => !own(e)).map(([x, y, e]) => `${n.type} at (${x}, ${y}): ${named(e)}`);
});
"""


def test_readme_screenshot_of_the_two_nodes(cpu_driver):
    """nodes.png, cropped to the workflow (docs/img/nodes.png is a copy of the pinned leg's): what a
    machine without a GPU shows (nodes_newest.png: the same on the newest frontend), nothing over it."""
    image = pytest.importorskip("PIL.Image")
    driver = cpu_driver
    _, status = driver.sage_server.get("/sage/status")
    assert status["kernel_active"] is False, status  # a real CPU install: no interpreter in the picture
    ids = driver.execute_script(README_GRAPH)
    _wait_panel(driver, ids["settings"], f"SageTriton · {status['arch']}", "the info panel")
    time.sleep(0.5)  # one more frame
    full = _shot(driver, "nodes_full.png")
    assert not driver.execute_script(HIDDEN_CORNERS), ids
    scale = driver.execute_script("return window.devicePixelRatio || 1")
    box = [round(v * scale) for v in driver.execute_script(GRAPH_BOX)]
    box = (box[0] - 10, box[1] - 22, box[2] + 30, box[3] + 20)  # the nodes' source badges sit above them
    lines = driver.execute_script(READ_NODE, ids["settings"])["lines"]
    assert lines[2] == "no GPU: ComfyUI's own attention runs", lines
    widgets = driver.execute_script(READ_NODE, ids["settings"])["widgets"]
    assert "fast_rope" in widgets and "sparse" in widgets and "sparse_extra_tokens" in widgets  # every input drawn
    out = ARTIFACTS / ("nodes.png" if driver.sage_frontend == "pinned" else "nodes_newest.png")
    with image.open(full) as shot:
        shot.crop(box).save(out)
    assert out.stat().st_size > 10_000


def test_unsupported_choices_are_marked(driver, sage_server):  # noqa: F811
    ids = driver.execute_script(BUILD_GRAPH, TINY_MODEL, random.randrange(2**31))
    _, info = sage_server.get("/object_info/SageTritonSettings")
    own_tip = info["SageTritonSettings"]["input"]["required"]["pv_precision"][1]["tooltip"]
    with simulated_ampere(driver, sage_server):
        _wait_panel(driver, ids["settings"], "⚠ fp8 → fp16 on this GPU", "the fp8 mark")
        settings = driver.execute_script(READ_NODE, ids["settings"])
        assert settings["lines"][0].startswith("SageTriton · sm80")
        assert settings["lines"][2].startswith("kernel "), settings["lines"]
        tip = settings["widgets"]["pv_precision"]["tooltip"]
        # The input's own tooltip first, then the GPU note with the full reason.
        assert tip.startswith(own_tip) and f"fp8: {AMPERE_WHY}" in tip and "On this GPU (sm80)" in tip
        assert settings["widgets"]["qk_quant_gran"]["tooltip"] is None  # untouched: nothing to mark
        # The run's downgrade note is said once as a toast (on the patch node only after its own run).
        _wait(driver, "return [...document.querySelectorAll('.p-toast-message')].some("
                      "t => t.textContent.includes('SageTriton') && t.textContent.includes('fp8 → fp16'))",
              10, "the downgrade toast")
        # Picking the unsupported value marks the widget's label; a supported one clears it.
        assert _pick(driver, ids["settings"], "pv_precision", "fp8").endswith("⚠ → fp16")
        _shot(driver, "sagetriton_fp8_marked.png")
        assert "⚠" not in (_pick(driver, ids["settings"], "pv_precision", "auto") or "")
        _pick(driver, ids["settings"], "pv_precision", "fp8")
    # Back to the real server (CPU): fp8 runs there, so the mark goes away.
    _, status = sage_server.get("/sage/status")
    _wait_panel(driver, ids["settings"], f"SageTriton · {status['arch']}", "the real status again")
    settings = driver.execute_script(READ_NODE, ids["settings"])
    if status["supported_choices"]["pv_precision"]["fp8"]["ok"] is not False:
        assert "⚠" not in (settings["widgets"]["pv_precision"]["label"] or "")
        assert settings["widgets"]["pv_precision"]["tooltip"] is None


MARKED_LABELS = ("return app.graph.nodes.flatMap(n => n.widgets ?? [])"
                 ".filter(w => (w.label ?? '').includes('⚠')).map(w => w.label)")
PANELS = ("return app.graph.nodes.filter(n => n.widgets?.some(w => w.name === 'sagetriton_info'))"
          ".map(n => n.widgets.find(w => w.name === 'sagetriton_info')).map(w => [!!w.hidden, w.lines.length])")


def _set_setting(driver, setting: str, value) -> None:
    driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "app.extensionManager.setting.set(arguments[0], arguments[1]).then(() => done(true));", setting, value)


def test_setting_hides_the_panels(driver, sage_server):  # noqa: F811
    setting = "SageTriton.NodeInfo.Show"
    listed = driver.execute_script(
        "return app.extensions.find(e => e.name === arguments[0]).settings.map(s => s.id)", EXT_NAME)
    assert setting in listed
    ids = driver.execute_script(BUILD_GRAPH, TINY_MODEL, random.randrange(2**31))
    with simulated_ampere(driver, sage_server):
        _wait_panel(driver, ids["settings"], "⚠ fp8 → fp16", "the fp8 mark")
        _pick(driver, ids["settings"], "pv_precision", "fp8")
        assert driver.execute_script(MARKED_LABELS)
        try:
            _set_setting(driver, setting, False)
            panels = driver.execute_script(PANELS)
            assert len(panels) == 2 and all(h and n == 0 for h, n in panels), panels
            assert not driver.execute_script(MARKED_LABELS)
        finally:
            _set_setting(driver, setting, True)
        panels = driver.execute_script(PANELS)
        assert len(panels) == 2 and all(not h and n >= 3 for h, n in panels), panels
        assert driver.execute_script(MARKED_LABELS)


def test_about_page_badge(driver):
    badges = driver.execute_script(
        "return app.extensions.find(e => e.name === arguments[0]).aboutPageBadges", EXT_NAME)
    assert badges and badges[0]["label"] == "SageTriton" and badges[0]["url"].startswith("https://")
    # The About panel renders it (Settings dialog → About).
    driver.execute_script("app.extensionManager.command.execute('Comfy.ShowSettingsDialog')")
    _wait(driver, "return !!document.querySelector('.settings-container, .p-dialog')", 15, "settings dialog")
    click_about = ("const about = [...document.querySelectorAll('.p-listbox-option, li, span')]"
                   ".find(e => e.textContent.trim() === 'About'); about && about.click();")
    driver.execute_script(click_about)
    found = _wait_clicking(driver, click_about, "return [...document.querySelectorAll('a')].some(a => a.textContent"
                           f".includes('SageTriton') && a.href === {json.dumps(badges[0]['url'])})",
                           30, "the about-page badge")
    assert found
    _shot(driver, "sagetriton_about.png")
    driver.execute_script("document.dispatchEvent(new KeyboardEvent('keydown', {key: 'Escape'}))")
    driver.find_element("tag name", "body").send_keys("\ue00c")  # Escape closes the dialog


def test_run_from_the_canvas_updates_the_patch_node(driver, sage_server):  # noqa: F811
    ids = driver.execute_script(BUILD_GRAPH, TINY_MODEL, random.randrange(2**31))
    driver.execute_async_script(
        "const done = arguments[arguments.length - 1]; window.__sageRun = null; window.__sageTexts = [];"
        " window.__sageRunEvents = [];"
        "import('/scripts/api.js').then(({api}) => {"
        " api.addEventListener('progress_text', e => { window.__sageTexts.push(e.detail); });"
        " api.addEventListener('sagetriton.run', e => { window.__sageRunEvents.push(e.detail); });"
        " api.addEventListener('execution_success', () => { window.__sageRun = 'success'; });"
        " api.addEventListener('execution_error', e => { window.__sageRun = 'error: ' + JSON.stringify(e.detail); });"
        " done(true); });")
    driver.execute_async_script(
        "const done = arguments[arguments.length - 1]; app.queuePrompt(0, 1).then(() => done(true));")
    outcome = _wait(driver, "return window.__sageRun", 120, "the prompt to finish")
    assert outcome == "success", (outcome, sage_server.log_tail())
    _, status = sage_server.get("/sage/status")
    run = status["last_run"]
    assert run and run["kernel"] + sum(run["fallback"].values()) > 0, run
    expected = f"last run: {run['kernel']} kernel · {sum(run['fallback'].values())} fallback"
    _wait(driver, f"const w = app.graph.getNodeById({ids['patch']}).widgets.find(w => w.name === 'sagetriton_info');"
                  f"return w.lines.some(l => l.startsWith({json.dumps(expected)}))", 20, "the last-run line")
    if run["fallback"]:
        top = max(run["fallback"], key=run["fallback"].get)
        lines = driver.execute_script(
            f"return app.graph.getNodeById({ids['patch']}).widgets.find(w => w.name === 'sagetriton_info').lines")
        assert f"{run['fallback'][top]}× {top}" in lines, lines
    # The node learnt it ran from the pack's own event; the summary shows once, in the panel: no progress
    # text, which the frontend would draw again as a raw, cut-off text box under it.
    events = _wait(driver, "return window.__sageRunEvents", 10, "the run event")
    assert [e["node"] for e in events] == [str(ids["patch"])], events
    # The panel shows the server's lines for that run verbatim, the ones the event carried.
    assert events[0]["lines"] == run["lines"] == status["runs_by_node"][str(ids["patch"])]["lines"]
    shown = driver.execute_script(READ_NODE, ids["patch"])["lines"]
    assert shown == status["panel"]["lines"] + run["lines"], shown
    assert driver.execute_script("return window.__sageTexts") == []
    shown = driver.execute_script(f"return app.graph.getNodeById({ids['patch']}).widgets.map(w => w.name)")
    assert shown == ["sagetriton_info"], shown  # the panel and nothing else (no '$$node-text-preview')
    time.sleep(0.5)  # one more frame for the screenshot
    _shot(driver, "sagetriton_after_run.png")


# Test code only: one model, two Patch nodes, each feeding its own sampler (1 and 2 steps).
TWO_PATCH_GRAPH = """
const [tiny, seed] = arguments;
app.graph.clear();
const add = (type, pos, values = {}) => {
  const n = LiteGraph.createNode(type); n.pos = pos; app.graph.add(n);
  for (const [k, v] of Object.entries(values)) n.widgets.find(w => w.name === k).value = v;
  return n;
};
const unet = add("UNETLoader", [20, 40], {unet_name: tiny});
const settings = add("SageTritonSettings", [20, 200], {min_seq_len: 0});
const cond = add("SageTritonE2ETinyConditioning", [20, 560]);
const latent = add("EmptyHunyuanLatentVideo", [20, 700], {width: 64, height: 64, length: 1});
const patches = [], samplers = [];
for (const [i, steps] of [[0, 1], [1, 2]]) {
  const patch = add("SageTritonPatchModelAttention", [430, 40 + 420 * i]);
  const ks = add("KSampler", [840, 40 + 420 * i], {steps, cfg: 1.0, seed: seed + i});
  const save = add("SaveLatent", [1200, 40 + 420 * i], {filename_prefix: "sagetriton_e2e_two_" + i});
  unet.connect(0, patch, 0); settings.connect(0, patch, 1); patch.connect(0, ks, 0);
  cond.connect(0, ks, 1); cond.connect(0, ks, 2); latent.connect(0, ks, 3); ks.connect(0, save, 0);
  patches.push(patch.id);
}
app.canvas.ds.scale = 0.6; app.canvas.ds.offset = [20, 20];
app.graph.setDirtyCanvas(true, true);
return patches;
"""
RUN_LINE = ("const w = app.graph.getNodeById(arguments[0]).widgets.find(w => w.name === 'sagetriton_info');"
            "return w.lines.find(l => l.startsWith('last run: '))")


# Test code only: /sage/status answers to requests made before the prompt ended arrive only after it
# ended, without the given node's run: as if read before the server recorded that run.
LATE_STATUS = """
const [lateId] = arguments;
const done = arguments[arguments.length - 1];
import('/scripts/api.js').then(({api}) => {
  const own = api.fetchApi;
  let ended = false, release;
  const endedP = new Promise(r => { release = r; });
  api.addEventListener('execution_success', () => { ended = true; setTimeout(release, 50); });
  window.__sageRestoreFetch = () => { api.fetchApi = own; };
  api.fetchApi = async function (route, options) {
    if (ended || !String(route).startsWith('/sage/status')) return own.call(this, route, options);
    const body = await (await own.call(this, route, options)).json();
    if (body?.runs_by_node) delete body.runs_by_node[String(lateId)];
    await endedP;
    return new Response(JSON.stringify(body), {status: 200, headers: {'Content-Type': 'application/json'}});
  };
  done(true);
});
"""


@pytest.mark.parametrize("late_status", [False, True], ids=["in_order", "late_status_answer"])
def test_each_patch_node_shows_its_own_run(driver, sage_server, late_status):  # noqa: F811
    """Two Patch nodes in one graph (1 and 2 sampling steps) each show their own counts, and a fresh
    node shows none, though the server has run other prompts before. ``late_status_answer``: a status
    answer read before the second node's run was recorded, arriving after the prompt ended, does not
    leave that node without its run."""
    ids = driver.execute_script(TWO_PATCH_GRAPH, TINY_MODEL, random.randrange(2**31))
    assert [driver.execute_script(RUN_LINE, i) for i in ids] == ["last run: none yet"] * 2
    if late_status:
        driver.execute_async_script(LATE_STATUS, ids[1])
    try:
        _run_two_patch_graph(driver, sage_server, ids)
    finally:
        driver.execute_script("window.__sageRestoreFetch?.(); window.__sageRestoreFetch = undefined;")


def _run_two_patch_graph(driver, server, ids):
    driver.execute_async_script(
        "const done = arguments[arguments.length - 1]; window.__sageRun = null;"
        "import('/scripts/api.js').then(({api}) => {"
        " api.addEventListener('execution_success', () => { window.__sageRun = 'success'; });"
        " api.addEventListener('execution_error', e => { window.__sageRun = 'error: ' + JSON.stringify(e.detail); });"
        " app.queuePrompt(0, 1).then(() => done(true)); });")
    assert _wait(driver, "return window.__sageRun", 180, "the prompt to finish") == "success", server.log_tail()
    _, status = server.get("/sage/status")
    runs = [status["runs_by_node"][str(i)] for i in ids]
    expected = [f"last run: {r['kernel']} kernel · {sum(r['fallback'].values())} fallback" for r in runs]
    assert expected[0] != expected[1], runs  # 1 step vs 2 steps: different counts
    _wait(driver, f"return {json.dumps(ids)}.every((id, i) => {{"
                  " const w = app.graph.getNodeById(id).widgets.find(w => w.name === 'sagetriton_info');"
                  f" return w.lines.includes({json.dumps(expected)}[i]); }})", 30, "each node's own run")
    time.sleep(0.5)  # one more frame for the screenshot
    _shot(driver, "sagetriton_two_patch_nodes.png")


EXAMPLES = sorted(p.stem for p in (Path(__file__).resolve().parent.parent / "workflows").glob("*.json"))

# Test code only: records what the page reports while an example loads (console errors and warnings,
# window.alert, new toasts such as the frontend's "Invalid workflow against zod schema" alert).
WATCH_PAGE = """
window.__sageComplaints = [];
const keep = (kind) => (...a) => window.__sageComplaints.push(kind + ': ' + a.map(String).join(' '));
for (const kind of ['error', 'warn']) {
  window.__sageConsole ??= {};
  window.__sageConsole[kind] ??= console[kind];
  console[kind] = (...a) => { keep('console.' + kind)(...a); window.__sageConsole[kind](...a); };
}
window.alert = keep('alert');
window.addEventListener('error', e => keep('uncaught')(e.message));
window.addEventListener('unhandledrejection', e => keep('unhandled rejection')(e.reason));
window.__sageToastsBefore = [...document.querySelectorAll('.p-toast-message')];
"""
COMPLAINTS = """
for (const kind of ['error', 'warn']) console[kind] = window.__sageConsole[kind];
const toasts = [...document.querySelectorAll('.p-toast-message')].filter(t => !window.__sageToastsBefore.includes(t));
return window.__sageComplaints.concat(toasts.map(t => 'toast: ' + t.textContent.trim()));
"""


# Test code only: open an example as a user opens a file (Workflow → Open, or dropped on the canvas), wait
# until its nodes are in the graph and the view is settled.
OPEN_FILE = """
const [url, name, done] = [arguments[0], arguments[1], arguments[arguments.length - 1]];
(async () => {
  const text = await (await fetch(url)).text();
  const wf = JSON.parse(text);
  await app.handleFile(new File([text], name + '.json', {type: 'application/json'}));
  const frame = () => new Promise(r => requestAnimationFrame(() => r()));
  for (let i = 0; i < 200 && app.graph.nodes.length !== wf.nodes.length; i++) await new Promise(r => setTimeout(r, 50));
  await frame(); await frame();  // the frontend fits the view in an animation frame
  const nodes = app.graph.nodes;
  done({expected: wf.nodes.length, loaded: nodes.length,
        unknown: nodes.filter(n => !LiteGraph.registered_node_types[n.type]).map(n => n.type),
        panels: nodes.filter(n => n.widgets?.some(w => w.name === 'sagetriton_info')).map(n => n.type),
        view: {scale: app.canvas.ds.scale, offset: Array.from(app.canvas.ds.offset)}});
})().catch(e => done({error: String(e)}));
"""


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_workflow_opens_cleanly_with_the_whole_graph_in_view(cpu_driver, name):
    """Opened from its file: no alert, toast, console error or warning of the pack's; every node known;
    every node in view, under none of the frontend's panels (1.58's sidebar lies over the canvas's left
    edge); a screenshot kept per example (the pinned frontend's is the template browser's thumbnail)."""
    driver = cpu_driver
    driver.execute_script(WATCH_PAGE)
    result = driver.execute_async_script(OPEN_FILE, f"/api/workflow_templates/{PACK_LINK}/{name}.json", name)
    assert "error" not in result, result
    time.sleep(1.0)  # toasts and the info panels' status fetch land after the load resolves
    complaints = [c for c in driver.execute_script(COMPLAINTS) if not _core_complaint(c)]
    assert not complaints, f"{name} did not load cleanly on the {driver.sage_frontend} frontend: {complaints}"
    assert result["loaded"] == result["expected"] and not result["unknown"], result
    assert "SageTritonPatchModelAttention" in result["panels"], result
    if driver.sage_frontend == "pinned":
        shot = _shot(driver, f"example_{_slug(name)}.png")
        _thumbnail(driver, shot, ARTIFACTS / f"{name}.jpg")
    else:
        shot = _shot(driver, f"example_{_slug(name)}_newest.png")
    hidden = driver.execute_script(HIDDEN_CORNERS)
    assert not hidden, (f"{name} on frontend {driver.sage_frontend_version}: nodes not in view ({shot.name}, "
                        f"view {result['view']}): {hidden}")


# ComfyUI's own complaints on the newest frontend against the 0.3.64 backend, never the pack's: the
# frontend asks for /api/jobs (a newer backend's route) and warns about its own deprecated input.link;
# 1.32 offers to switch Vue nodes back off in a toast once they are turned on.
CORE_COMPLAINTS = ("/api/jobs", "input.link is deprecated", "Prefer the legacy design?")


def _core_complaint(text: str) -> bool:
    return any(c in text for c in CORE_COMPLAINTS) and "sagetriton" not in text.lower()


# The pack's entry in the template browser's side list, clicked as a person would: the visible element with
# its name, through its list item or button (the bare text node's element may be a copy the list hides).
_CLICK_PACK_ENTRY = ("const e = [...document.querySelectorAll('.p-dialog li, .p-dialog button, .p-dialog span, "
                     ".p-dialog div')].find(e => e.textContent.trim() === NAME && !e.children.length "
                     "&& e.getClientRects().length);"
                     "if (e) (e.closest('li, button, a, [role=option], [role=button], [role=menuitem]') || e).click();"
                     ).replace("NAME", json.dumps(PACK_LINK))

# The dialog shows exactly three pictures, each loaded and on the pack's card (the nearest box naming one of
# its templates holds that one picture; core's pictures are on cards naming none of them).
PACK_THUMBNAILS = ("const names = NAMES, imgs = [...document.querySelectorAll('.p-dialog img')];"
                   "const card = i => { let e = i.parentElement;"
                   " while (e && !names.some(n => e.textContent.includes(n))) e = e.parentElement; return e; };"
                   "return imgs.length === 3 && imgs.every(i => i.complete && i.naturalWidth > 100"
                   " && card(i)?.querySelectorAll('img').length === 1)").replace("NAMES", json.dumps(EXAMPLES))


def test_template_browser_shows_titles_and_thumbnails(cpu_driver):
    """ComfyUI's template browser, as a user opens it: the pack's three cards, titled, with real pictures."""
    driver = cpu_driver
    if driver.sage_frontend != "pinned":
        pytest.skip("the template browser's picture (docs/img/template_browser.png) is the pinned frontend's")
    driver.execute_script("performance.clearResourceTimings();"
                          "app.extensionManager.command.execute('Comfy.BrowseTemplates')")
    started = time.monotonic()
    # The fetches take ms; rendering core's cards is what takes the time (about 3 s on an idle machine,
    # several times that on a loaded one), as the page load.
    _wait(driver, _CLICK_PACK_ENTRY + "return !!e;", 90, "the pack's entry in the template browser")
    fetched = driver.execute_script("return performance.getEntriesByType('resource').map(e => [e.name.split('/')"
                                    ".slice(3).join('/'), Math.round(e.startTime), Math.round(e.duration)])")
    print(f"template browser entry after {time.monotonic() - started:.1f} s; fetched: {fetched[:40]}")
    # Three decoded pictures on the pack's cards. A click made before the dialog is ready is lost (it then
    # selects core's first category, whose cards have pictures too): click again until they show.
    _wait_clicking(driver, _CLICK_PACK_ENTRY, PACK_THUMBNAILS, 90,
                   "three loaded thumbnails")  # decoding waits for the cards' rendering: as long on a loaded machine
    text = driver.execute_script("return document.querySelector('.p-dialog').textContent")
    assert all(name in text for name in EXAMPLES), text[:2000]
    time.sleep(0.5)  # one more frame for the screenshot
    _shot(driver, "template_browser.png")
    driver.find_element("tag name", "body").send_keys("\ue00c")  # Escape closes the dialog


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name.lower()).strip("_")


GRAPH_BOX = """
const r = app.canvas.canvas.getBoundingClientRect(), ds = app.canvas.ds;
const xs = app.graph.nodes.flatMap(n => [n.pos[0], n.pos[0] + n.size[0]]);
const ys = app.graph.nodes.flatMap(n => [n.pos[1] - 30, n.pos[1] + n.size[1]]);
const px = (v, i) => (v + ds.offset[i]) * ds.scale;
return [r.left + px(Math.min(...xs), 0) - 10, r.top + px(Math.min(...ys), 1) - 10,
        r.left + px(Math.max(...xs), 0) + 10, r.top + px(Math.max(...ys), 1) + 10];
"""


def _thumbnail(driver, shot: Path, out: Path) -> None:
    """The template browser's thumbnail (<name>.jpg next to the workflow): the graph, cropped.
    workflows/*.jpg are copies of these."""
    image = pytest.importorskip("PIL.Image")
    scale = driver.execute_script("return window.devicePixelRatio || 1")
    box = [round(v * scale) for v in driver.execute_script(GRAPH_BOX)]
    with image.open(shot) as full:
        box = (max(box[0], 0), max(box[1], 0), min(box[2], full.width), min(box[3], full.height))
        thumb = full.crop(box).convert("RGB")
        thumb.thumbnail((768, 768))
        thumb.save(out, quality=85)


# Test code only: turn Vue nodes on (or off), load an example, and read back each node's box on the page
# and its text as drawn in the DOM.
VUE_EXAMPLE = """
const [url, vue, done] = [arguments[0], arguments[1], arguments[arguments.length - 1]];
(async () => {
  await app.extensionManager.setting.set('Comfy.VueNodes.Enabled', vue);
  const wf = await (await fetch(url)).json();
  await app.loadGraphData(wf, true, true, 'sagetriton-vue');
  await new Promise(r => setTimeout(r, 2500));  // Vue renders the nodes and measures them
  const boxes = {};
  for (const el of document.querySelectorAll('[data-node-id]')) {
    const r = el.getBoundingClientRect();
    const n = app.graph.getNodeById(el.dataset.nodeId);
    if (n && r.width > 0) boxes[el.dataset.nodeId] = {type: n.type, box: [r.left, r.top, r.right, r.bottom],
      panel: n.widgets?.find(w => w.name === 'sagetriton_info')?.lines ?? null,
      drawn: Math.max(0, ...[...el.querySelectorAll('canvas')].map(c => c.getBoundingClientRect().height))};
  }
  done(boxes);
})().catch(e => done({error: String(e)}));
"""


def _overlaps(boxes: dict) -> list:
    items = sorted(boxes.values(), key=lambda b: b["type"])
    return [(a["type"], b["type"]) for i, a in enumerate(items) for b in items[i + 1:]
            if min(a["box"][2], b["box"][2]) - max(a["box"][0], b["box"][0]) > 2
            and min(a["box"][3], b["box"][3]) - max(a["box"][1], b["box"][1]) > 2]


# The README: with Vue nodes ("Nodes 2.0") on, the panels show from this frontend on (1.32 draws a
# custom widget in a Vue node; 1.27, whose Vue nodes were an experiment, draws only its own widget types).
VUE_PANELS_FROM = (1, 32)


def _version(text) -> tuple:
    return tuple(int(p) for p in str(text).split(".")[:2])


def test_readme_says_from_which_frontend_the_panels_show_with_vue_nodes():
    readme = (ROOT / "README.md").read_text()
    shown = ".".join(map(str, VUE_PANELS_FROM))
    assert re.search(rf"with Vue nodes[^.]*\bfrom frontend {re.escape(shown)}\b", readme), shown


@pytest.mark.parametrize("name", EXAMPLES)
def test_vue_nodes_show_the_panel_where_the_readme_says(cpu_driver, name):
    """With Vue nodes on: from frontend 1.32 the Patch node's panel shows, and no two nodes of an example
    cover each other (Vue's widgets are taller than the canvas's); on 1.27 the panel is not drawn, as the
    README says (the classic canvas shows it there)."""
    driver = cpu_driver
    shows = _version(driver.sage_frontend_version) >= VUE_PANELS_FROM
    driver.execute_script(WATCH_PAGE)
    try:
        boxes = driver.execute_async_script(VUE_EXAMPLE, f"/api/workflow_templates/{PACK_LINK}/{name}.json", True)
        _shot(driver, f"vue_{_slug(name)}_{driver.sage_frontend}.png")
    finally:
        driver.execute_async_script("const done = arguments[arguments.length - 1];"
                                    "app.extensionManager.setting.set('Comfy.VueNodes.Enabled', false).then(done)")
    assert "error" not in boxes and boxes, boxes
    complaints = [c for c in driver.execute_script(COMPLAINTS) if not _core_complaint(c)]
    assert not complaints, complaints
    patch = next(b for b in boxes.values() if b["type"] == "SageTritonPatchModelAttention")
    assert "no GPU: ComfyUI's own attention runs" in patch["panel"], patch  # the lines exist either way
    if not shows:
        assert patch["drawn"] == 0, (driver.sage_frontend_version, patch)  # else the README is out of date
        return
    # The panel's lines, drawn into the Vue node (a canvas of its own, several lines high).
    assert patch["drawn"] >= 6 * len(patch["panel"]), (driver.sage_frontend_version, patch)
    assert not _overlaps(boxes), (_overlaps(boxes), {k: (b["type"], b["box"]) for k, b in boxes.items()})


def test_a_backend_that_cannot_run_here_says_so_on_the_nodes(cpu_driver):
    """backend=SageAttention on a machine without a GPU: as soon as it is picked, the Sage Settings node
    says it cannot run here and what runs instead (panel line, widget mark, tooltip with the reason); after
    a run the Patch node says it too. No install advice: the library would not run here either."""
    driver = cpu_driver
    _, status = driver.sage_server.get("/sage/status")
    backend = status["backends"]["SageAttention"]
    short = "SageAttention unavailable here → ComfyUI"
    assert backend["ok"] is False and backend["short"] == short and "pip install" not in backend["why"], backend
    ids = driver.execute_script(BUILD_GRAPH, TINY_MODEL, random.randrange(2**31))
    _wait_panel(driver, ids["settings"], f"SageTriton · {status['arch']}", "the info panel")
    assert f"⚠ {short}" not in driver.execute_script(READ_NODE, ids["settings"])["lines"]  # SageTriton picked
    assert _pick(driver, ids["settings"], "backend", "SageAttention").endswith("⚠ → ComfyUI")
    _wait_panel(driver, ids["settings"], f"⚠ {short}", "the unavailable backend on Sage Settings")
    settings = driver.execute_script(READ_NODE, ids["settings"])
    assert f"SageAttention: {backend['why']}" in settings["widgets"]["backend"]["tooltip"], settings["widgets"]
    driver.execute_async_script(
        "const done = arguments[arguments.length - 1]; window.__sageRun = null;"
        "import('/scripts/api.js').then(({api}) => {"
        " api.addEventListener('execution_success', () => { window.__sageRun = 'success'; });"
        " api.addEventListener('execution_error', e => { window.__sageRun = 'error: ' + JSON.stringify(e.detail); });"
        " app.queuePrompt(0, 1).then(() => done(true)); });")
    outcome = _wait(driver, "return window.__sageRun", 120, "the prompt to finish")
    assert outcome == "success", (outcome, driver.sage_server.log_tail())
    _wait_panel(driver, ids["patch"], f"⚠ {short}", "the unavailable backend on the Patch node after its run")
    time.sleep(0.5)  # one more frame for the screenshot
    _shot(driver, f"backend_unavailable_{driver.sage_frontend}.png")
    _pick(driver, ids["settings"], "backend", "SageTriton")
    assert f"⚠ {short}" not in driver.execute_script(READ_NODE, ids["settings"])["lines"]
