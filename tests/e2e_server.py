"""The end-to-end tests' shared ComfyUI server: one per test session, reused by every e2e module.

Built on ``comfy_server.comfy_server`` (the pack linked into a temp ComfyUI base directory, a free
port, ``main.py --cpu``) plus what the e2e tests need before start-up, passed through an extra
model-paths config: the test-only node pack ``tests/e2e_pack`` and a tiny random-weight Wan 2.1
model saved as safetensors in a ``diffusion_models`` folder for ComfyUI's own UNETLoader.
"""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from pathlib import Path

import pytest
from comfy_server import PACK_FOLDER_NAME, comfy_server

TESTS_DIR = Path(__file__).resolve().parent
PACK_LINK = PACK_FOLDER_NAME  # served as /extensions/<PACK_LINK>/, templates under the same name
TEST_PACK_LINK = "sagetriton_e2e_testpack"
TINY_MODEL = "sagetriton_tiny_wan21.safetensors"
# A first visit opens the template browser over the canvas, loading a workflow warns about missing
# models (1.58: an "N issues found" box over the canvas's top right): the browser tests want the canvas.
UI_SETTINGS = {"Comfy.TutorialCompleted": True, "Comfy.Workflow.ShowMissingModelsWarning": False,
               "Comfy.ErrorSystem.ShowMissingModels": False, "Comfy.Workflow.ShowMissingNodesWarning": False}


def save_tiny_wan21(path: Path) -> None:
    """A 2.5M-parameter Wan 2.1 t2v (dim 256 = 2 heads of 128) that ComfyUI's detection accepts."""
    import comfy.supported_models
    import comfy.utils
    import torch

    cfg = dict(image_model="wan2.1", model_type="t2v", dim=256, ffn_dim=512, num_heads=2, num_layers=1,
               in_dim=16, out_dim=16, patch_size=(1, 2, 2), freq_dim=256, text_len=512, text_dim=4096,
               window_size=(-1, -1), qk_norm=True, cross_attn_norm=True, eps=1e-6)
    mc = comfy.supported_models.WAN21_T2V(cfg)
    mc.set_inference_dtype(torch.float32, None)
    model = mc.get_model({})
    g = torch.Generator().manual_seed(0)
    # Small random weights: ComfyUI's ops leave parameters uninitialised.
    sd = {k: (torch.randn(v.shape, generator=g) * 0.02).to(torch.float16)
          for k, v in model.diffusion_model.state_dict().items()}
    comfy.utils.save_torch_file(sd, str(path))


class E2EServer:
    """``comfy_server.ComfyServer`` with JSON-or-text answers and a prompt runner."""

    def __init__(self, srv):
        self.srv = srv
        self.url = srv.url

    def request(self, method: str, path: str, body=None, timeout: float = 30):
        """(status, body): JSON decoded when it parses, else text; HTTP errors are returned, not raised."""
        if method == "POST":
            code, answer = self.srv.post_json(path, body, timeout)
            return code, (answer.decode(errors="replace") if isinstance(answer, bytes) else answer)
        code, raw = self.srv.get(path, timeout)
        try:
            return code, json.loads(raw)
        except ValueError:
            return code, raw.decode(errors="replace")

    def get(self, path: str, timeout: float = 30):
        return self.request("GET", path, timeout=timeout)

    def post(self, path: str, body, timeout: float = 30):
        return self.request("POST", path, body, timeout=timeout)

    def log_tail(self, n: int = 8000) -> str:
        return self.srv.log(n)

    def alive(self) -> bool:
        return self.srv.process.poll() is None

    def run_prompt(self, prompt: dict, timeout: float = 120) -> dict:
        """Queue an API-format prompt and wait for its history entry."""
        code, answer = self.post("/prompt", {"prompt": prompt, "client_id": "sagetriton-e2e"})
        assert code == 200, f"prompt rejected ({code}): {answer}"
        pid = answer["prompt_id"]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            _, hist = self.get(f"/history/{pid}")
            if isinstance(hist, dict) and pid in hist:
                return hist[pid]
            time.sleep(0.25)
        raise TimeoutError(f"prompt {pid} did not finish in {timeout} s:\n{self.log_tail()}")


@contextlib.contextmanager
def e2e_server(comfyui_path, env: dict | None = None, extra_args=()):
    with tempfile.TemporaryDirectory(prefix="sagetriton-e2e-") as tmp:
        extra = Path(tmp)
        (extra / "custom_nodes").mkdir()
        (extra / "custom_nodes" / TEST_PACK_LINK).symlink_to(TESTS_DIR / "e2e_pack", target_is_directory=True)
        (extra / "diffusion_models").mkdir()
        save_tiny_wan21(extra / "diffusion_models" / TINY_MODEL)
        paths = extra / "extra_model_paths.yaml"  # JSON is YAML
        paths.write_text(json.dumps({"sagetriton_e2e": {
            "base_path": str(extra), "custom_nodes": "custom_nodes", "diffusion_models": "diffusion_models"}}))
        args = ["--extra-model-paths-config", str(paths), "--disable-api-nodes", *extra_args]
        with comfy_server(comfyui_path, extra_args=args, env=env) as srv:
            (srv.user / "default").mkdir(parents=True, exist_ok=True)
            (srv.user / "default" / "comfy.settings.json").write_text(json.dumps(UI_SETTINGS))
            yield E2EServer(srv)


def flat_defaults(status: dict) -> dict:
    """The resolved default config; the route may key it by head_dim ({"64": ..., "128": ...})."""
    d = status["defaults"]
    return d if "qk_quant_gran" in d else d.get("128") or next(iter(d.values()))


def choices_of(status: dict) -> dict:
    """{option: {value: (ok, why)}} from ``choices`` or ``supported_choices``, lists or {ok, why} objects."""
    raw = status.get("choices", status.get("supported_choices"))
    assert raw is not None, f"/sage/status lacks choices (supported_choices(arch)): {sorted(status)}"
    norm = lambda e: (e[0], e[1]) if isinstance(e, list) else (e["ok"], e.get("why", e.get("reason", "")))
    return {opt: {v: norm(e) for v, e in vals.items()} for opt, vals in raw.items()}


_SERVER: E2EServer | None = None


@pytest.fixture(scope="session")
def sage_server(comfyui_path, request):
    """The session's server (started by whichever e2e module asks first, stopped at session end)."""
    global _SERVER
    if _SERVER is None:
        stack = contextlib.ExitStack()
        _SERVER = stack.enter_context(e2e_server(comfyui_path))
        request.addfinalizer(stack.close)
    if not _SERVER.alive():
        pytest.fail(f"the e2e ComfyUI server died:\n{_SERVER.log_tail()}")
    return _SERVER


# The newest frontend from PyPI (comfyui-frontend-package), installed apart from the pinned one that
# ComfyUI's requirements bring (.ci/run: pip install --target <venv>/frontend-newest); ComfyUI serves it
# with --front-end-root. SAGETRITON_NEWEST_FRONTEND names another such folder.
NEWEST_FRONTEND_INSTALL = "pip install --target <venv>/frontend-newest 'comfyui-frontend-package==1.58.*'"


def newest_frontend_root() -> Path | None:
    import sys

    folder = Path(os.environ.get("SAGETRITON_NEWEST_FRONTEND") or Path(sys.prefix) / "frontend-newest")
    static = folder / "comfyui_frontend_package" / "static"
    return static if (static / "index.html").is_file() else None


# Servers started once per session, by key: "pinned" (the frontend ComfyUI's requirements install),
# "newest" (newest_frontend_root), each as a real CPU install (no Triton interpreter: the pictures show
# what a user without a GPU sees).
_CPU_SERVERS: dict = {}


def cpu_install_server(comfyui_path, request, frontend: str) -> E2EServer:
    if frontend not in _CPU_SERVERS:
        args = []
        if frontend == "newest":
            root = newest_frontend_root()
            if root is None:
                pytest.skip(f"the newest ComfyUI frontend is not installed ({NEWEST_FRONTEND_INSTALL})")
            args = ["--front-end-root", str(root)]
        stack = contextlib.ExitStack()
        _CPU_SERVERS[frontend] = stack.enter_context(
            e2e_server(comfyui_path, env={"TRITON_INTERPRET": "0"}, extra_args=args))
        request.session.config.add_cleanup(stack.close)
    server = _CPU_SERVERS[frontend]
    if not server.alive():
        pytest.fail(f"the e2e ComfyUI server ({frontend} frontend) died:\n{server.log_tail()}")
    return server
