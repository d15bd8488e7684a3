"""End-to-end: the pack inside a real ComfyUI server (HTTP API), CPU only."""
from __future__ import annotations

import json
import random
import urllib.parse
import uuid
from pathlib import Path

import pytest
from e2e_server import PACK_LINK, TINY_MODEL, choices_of, flat_defaults, sage_server  # noqa: F401

from conftest import needs_comfyui

pytestmark = [needs_comfyui, pytest.mark.server]

SETTINGS = "SageTritonSettings"
PATCH = "SageTritonPatchModelAttention"


@pytest.fixture(scope="module")
def object_info(sage_server):  # noqa: F811
    code, info = sage_server.get("/object_info")
    assert code == 200
    return info


def _inputs(node_info: dict) -> dict:
    return {**node_info["input"].get("required", {}), **node_info["input"].get("optional", {})}


def _settings_defaults(object_info) -> dict:
    """Every Sage Settings input at its advertised default (first choice for combos)."""
    values = {}
    for name, spec in _inputs(object_info[SETTINGS]).items():
        kind, opts = spec[0], (spec[1] if len(spec) > 1 else {})
        if isinstance(kind, list):
            values[name] = opts.get("default", kind[0])
        elif kind == "COMBO":
            values[name] = opts.get("default", opts["options"][0])
        else:
            values[name] = opts["default"]
    return values


def test_object_info_lists_both_nodes_with_tooltips(object_info):
    assert object_info[SETTINGS]["display_name"] == "Sage Settings"
    assert object_info[PATCH]["display_name"] == "Patch Model Attention"
    assert object_info[SETTINGS]["output"] == ["SAGE_SETTINGS"]
    assert object_info[PATCH]["output"] == ["MODEL"]
    patch_in = object_info[PATCH]["input"]
    assert patch_in["required"]["model"][0] == "MODEL"
    assert patch_in["optional"]["settings"][0] == "SAGE_SETTINGS"
    settings_in = _inputs(object_info[SETTINGS])
    assert set(settings_in) >= {"qk_quant_gran", "pv_precision", "pv_accum_dtype", "smooth_k", "smooth_v",
                                "min_seq_len", "fallback", "full_precision_first_steps",
                                "full_precision_last_steps"}
    for node in (SETTINGS, PATCH):
        for name, spec in _inputs(object_info[node]).items():
            opts = spec[1] if len(spec) > 1 else {}
            assert opts.get("tooltip"), f"{node}.{name} has no tooltip"


def test_status_route_answers(sage_server):  # noqa: F811
    for path in ("/sage/status", "/api/sage/status"):
        code, status = sage_server.get(path)
        assert code == 200, (path, status)
        assert isinstance(status, dict)
        for key in ("device", "arch", "vendor", "defaults", "stats"):
            assert key in status, f"{path} lacks {key!r}: {sorted(status)}"
        assert {"qk_quant_gran", "pv_precision", "pv_accum_dtype", "min_seq_len"} <= set(flat_defaults(status))
        assert {"kernel", "fallback"} <= set(status["stats"])


def test_status_reports_choices_for_every_settings_option(sage_server, object_info):  # noqa: F811
    # The web extension marks unsupported choices from this; fp8 P·V never runs on the CPU "arch".
    _, status = sage_server.get("/sage/status")
    choices = choices_of(status)
    settings_in = _inputs(object_info[SETTINGS])
    for option in ("qk_quant_gran", "pv_precision", "pv_accum_dtype"):
        offered = settings_in[option][0] if isinstance(settings_in[option][0], list) \
            else settings_in[option][1]["options"]
        assert set(offered) - {"auto"} <= set(choices[option]), (option, offered, choices[option])
    for option, values in choices.items():
        for value, (ok, why) in values.items():
            assert isinstance(ok, bool), (option, value)
            if not ok:  # the UI shows the part after the arrow, e.g. "fp8 → fp16 on this GPU"
                assert "→" in why, (option, value, why)


def test_extension_script_is_served(sage_server):  # noqa: F811
    code, listing = sage_server.get("/extensions")
    assert code == 200
    ours = [p for p in listing if p.startswith(f"/extensions/{PACK_LINK}/")]
    assert f"/extensions/{PACK_LINK}/sagetriton.js" in ours
    assert not [p for p in ours if p.endswith(".mjs")], "helpers must not be auto-loaded"
    for path in ours + [f"/extensions/{PACK_LINK}/sage_format.mjs"]:
        code, body = sage_server.get(path)
        assert code == 200 and ("registerExtension" in body or "export function" in body), path


def _prompt(settings: dict, steps: int = 1, seed: int = 0) -> dict:
    return {
        "1": {"class_type": "UNETLoader", "inputs": {"unet_name": TINY_MODEL, "weight_dtype": "default"}},
        "2": {"class_type": SETTINGS, "inputs": settings},
        "3": {"class_type": PATCH, "inputs": {"model": ["1", 0], "settings": ["2", 0]}},
        "4": {"class_type": "SageTritonE2ETinyConditioning", "inputs": {"width": 4096, "tokens": 8, "seed": 0}},
        "5": {"class_type": "EmptyHunyuanLatentVideo",
              "inputs": {"width": 64, "height": 64, "length": 1, "batch_size": 1}},
        "6": {"class_type": "KSampler", "inputs": {
            "model": ["3", 0], "seed": seed, "steps": steps, "cfg": 1.0, "sampler_name": "euler",
            "scheduler": "simple", "positive": ["4", 0], "negative": ["4", 0], "latent_image": ["5", 0],
            "denoise": 1.0}},
        "7": {"class_type": "SaveLatent", "inputs": {"samples": ["6", 0], "filename_prefix": "sagetriton_e2e"}},
    }


def test_invalid_settings_value_is_rejected_and_server_keeps_serving(sage_server, object_info):  # noqa: F811
    settings = {**_settings_defaults(object_info), "pv_precision": "fp9"}
    code, answer = sage_server.post("/prompt", {"prompt": _prompt(settings)})
    assert code == 400, answer
    errors = answer["node_errors"]["2"]["errors"]
    assert any("pv_precision" in (e.get("details", "") + e.get("message", "") + str(e.get("extra_info", "")))
               for e in errors), errors
    assert sage_server.get("/sage/status")[0] == 200
    assert sage_server.get("/object_info/" + SETTINGS)[0] == 200


@pytest.mark.parametrize("name,value", [("smooth_k", "false"), ("fast_rope", "no")])
def test_a_string_for_a_boolean_input_is_refused_not_read_as_true(sage_server, object_info, name, value):  # noqa: F811
    """Issue 49 item 9: ComfyUI's validation reads any non-empty value of a BOOLEAN input as true."""
    settings = {**_settings_defaults(object_info), name: value}
    code, answer = sage_server.post("/prompt", {"prompt": _prompt(settings)})
    assert code == 400, answer
    errors = answer["node_errors"]["2"]["errors"]
    assert any(f"{name}: {value!r} is not true or false" in e.get("details", "") for e in errors), errors


def test_full_prompt_patches_samples_and_reports(sage_server, object_info):  # noqa: F811
    # min_seq_len=0: the kernel may run even at this toy sequence length.
    settings = {**_settings_defaults(object_info), "min_seq_len": 0}
    _, before = sage_server.get("/sage/status")
    # A fresh seed: ComfyUI would answer an identical earlier prompt from its cache, without sampling.
    entry = sage_server.run_prompt(_prompt(settings, seed=random.randrange(2**31)))
    assert entry["status"]["status_str"] == "success", (entry["status"], sage_server.log_tail())
    assert entry["outputs"]["7"]["latents"], entry["outputs"]

    _, status = sage_server.get("/sage/status")
    run = status.get("last_run")
    assert run, f"/sage/status has no last_run after a sampled prompt: {sorted(status)}"
    calls = run["kernel"] + sum(run["fallback"].values())
    assert calls > 0, f"the patched model's attention never reached the override: {run}"
    # Process-wide counters moved by at least this run's calls.
    total = lambda s: s["stats"]["kernel"] + sum(s["stats"]["fallback"].values())
    assert total(status) - total(before) >= calls


WORKFLOWS = sorted((Path(__file__).resolve().parent.parent / "workflows").glob("*.json"))
MODEL_FILE = (".safetensors", ".sft", ".ckpt", ".pt", ".pth", ".gguf")


FRONTEND_ONLY = {"Note", "MarkdownNote"}  # the frontend's own nodes: never sent to the server


def test_example_workflows_are_served_as_templates(sage_server):  # noqa: F811
    names = {p.stem for p in WORKFLOWS}
    assert len(names) == 3
    code, templates = sage_server.get("/workflow_templates")
    assert code == 200 and set(templates.get(PACK_LINK, [])) == names, templates
    for name in names:
        # The URLs the template browser builds (ComfyUI 0.3.64, frontend 1.27): the file name is the
        # card's title, <name>.jpg its thumbnail.
        path = f"/api/workflow_templates/{PACK_LINK}/{urllib.parse.quote(name)}"
        code, body = sage_server.get(path + ".json")
        assert code == 200 and body["nodes"], name
        status, thumb = sage_server.srv.get(path + ".jpg")
        assert status == 200 and thumb[:3] == b"\xff\xd8\xff" and len(thumb) > 5_000, name


def test_example_workflows_have_title_description_and_unique_ids():
    ids = set()
    for path in WORKFLOWS:
        wf = json.loads(path.read_text())
        info = wf["extra"]["sagetriton"]
        assert info["title"] == path.stem and len(info["description"]) > 40 and "\n" not in info["description"]
        # The description is on the canvas too, in a note.
        notes = [n["widgets_values"][0] for n in wf["nodes"] if n["type"] == "Note"]
        assert any(info["description"] in text for text in notes), path.name
        assert str(uuid.UUID(wf["id"])) == wf["id"] and int(uuid.UUID(wf["id"])) != 0
        ids.add(wf["id"])
        assert (path.with_suffix(".jpg")).is_file(), f"{path.name}: no thumbnail"
    assert len(ids) == len(WORKFLOWS)


def _nulls(value, where=""):
    """Paths holding null that the frontend's workflow schema rejects (only links may be null)."""
    if isinstance(value, dict):
        return [p for k, v in value.items() if not (v is None and k in ("link", "links"))
                for p in _nulls(v, f"{where}.{k}")]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _nulls(v, f"{where}[{i}]")]
    return [where] if value is None else []


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.stem)
def test_example_workflow_has_no_null_the_frontend_rejects(path):
    assert not _nulls(json.loads(path.read_text())), path.name


def _widget_inputs(spec: dict) -> list[tuple[str, list | str, dict]]:
    """Inputs the frontend turns into widgets, in its order, plus control_after_generate slots."""
    out = []
    for section in ("required", "optional"):
        for name, s in spec["input"].get(section, {}).items():
            kind, opts = s[0], (s[1] if len(s) > 1 else {})
            if isinstance(kind, list) or kind in ("COMBO", "INT", "FLOAT", "STRING", "BOOLEAN"):
                out.append((name, kind, opts))
                if opts.get("control_after_generate"):
                    out.append((name + ".control_after_generate", "CONTROL", {}))
    return out


def _check_value(where: str, kind, opts: dict, value) -> None:
    if kind == "CONTROL":
        assert value in ("fixed", "increment", "decrement", "randomize"), where
    elif isinstance(kind, list) or kind == "COMBO":
        choices = kind if isinstance(kind, list) else opts["options"]
        if not (isinstance(value, str) and value.endswith(MODEL_FILE)):  # model files: the user's own
            assert value in choices, f"{where}: {value!r} not in {choices}"
    elif kind == "BOOLEAN":
        assert isinstance(value, bool), where
    elif kind in ("INT", "FLOAT"):
        assert isinstance(value, (int, float)) and not isinstance(value, bool), where
        assert opts.get("min", value) <= value <= opts.get("max", value), f"{where}: {value} out of range"
        if kind == "INT":
            assert float(value).is_integer(), where
    elif kind == "STRING":
        assert isinstance(value, str), where


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.stem)
def test_example_workflow_matches_the_servers_nodes(path, object_info):
    """UI format, every node type known to this ComfyUI, widget values valid, links type-correct."""
    wf = json.loads(path.read_text())
    assert wf.get("version") is not None and wf["nodes"] and wf["links"]
    types = {n["type"] for n in wf["nodes"]}
    assert PATCH in types, "every example uses Patch Model Attention"
    nodes = {n["id"]: n for n in wf["nodes"]}
    for node in (n for n in wf["nodes"] if n["type"] not in FRONTEND_ONLY):
        where = f"{path.name} node {node['id']} ({node['type']})"
        assert node["type"] in object_info, f"{where}: unknown node type"
        spec = object_info[node["type"]]
        widgets = _widget_inputs(spec)
        values = node.get("widgets_values") or []
        assert len(values) == len(widgets), f"{where}: {len(values)} widget values for {[w[0] for w in widgets]}"
        for (name, kind, opts), value in zip(widgets, values, strict=True):
            _check_value(f"{where}.{name}", kind, opts, value)
    for link_id, src, src_slot, dst, dst_slot, ltype in wf["links"]:
        out_type = object_info[nodes[src]["type"]]["output"][src_slot]
        dst_input = nodes[dst]["inputs"][dst_slot]
        assert dst_input["link"] == link_id and ltype == out_type == dst_input["type"], (path.name, link_id)
    # Every required non-widget input is connected: the workflow runs once the models are there.
    for node in (n for n in wf["nodes"] if n["type"] not in FRONTEND_ONLY):
        for inp in node.get("inputs", []):
            required = object_info[node["type"]]["input"].get("required", {})
            if inp["name"] in required and not inp.get("widget"):
                assert inp.get("link") is not None, f"{path.name}: {node['type']}.{inp['name']} unconnected"
