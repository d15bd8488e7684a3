"""One real ComfyUI server per test session, with SageTriton linked into its custom_nodes.

``comfy_server`` (session-scoped) starts ``main.py --cpu`` from the ComfyUI the conftest found,
with temporary base/output/user directories, a free port, the pack and the test-only pack
(``tests/e2e_pack``) symlinked in, and a tiny random-weight Wan 2.1 model saved as safetensors in
``models/diffusion_models`` for ComfyUI's own UNETLoader. Test modules import the fixture; the
server itself is a process-wide singleton so several modules share it.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

PACK_DIR = Path(__file__).resolve().parent.parent
PACK_LINK = "sagetriton"  # served as /extensions/sagetriton/
TEST_PACK_LINK = "sagetriton_e2e_testpack"
TINY_MODEL = "sagetriton_tiny_wan21.safetensors"
START_TIMEOUT_S = 180


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


class ComfyServer:
    def __init__(self, comfyui: Path):
        self.comfyui = comfyui
        self.base = Path(tempfile.mkdtemp(prefix="sagetriton-e2e-"))
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = self.base / "server.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        for d in ("out", "user/default"):
            (self.base / d).mkdir(parents=True)
        # A first visit opens the template browser over the canvas; the tests want the canvas.
        (self.base / "user/default/comfy.settings.json").write_text(json.dumps({
            "Comfy.TutorialCompleted": True, "Comfy.Workflow.ShowMissingModelsWarning": False,
            "Comfy.Workflow.ShowMissingNodesWarning": False}))
        nodes = self.base / "custom_nodes"
        nodes.mkdir()
        (nodes / PACK_LINK).symlink_to(PACK_DIR, target_is_directory=True)
        (nodes / TEST_PACK_LINK).symlink_to(PACK_DIR / "tests" / "e2e_pack", target_is_directory=True)
        models = self.base / "models" / "diffusion_models"
        models.mkdir(parents=True)
        save_tiny_wan21(models / TINY_MODEL)
        cmd = [sys.executable, "main.py", "--cpu", "--listen", "127.0.0.1", "--port", str(self.port),
               "--base-directory", str(self.base), "--output-directory", str(self.base / "out"),
               "--user-directory", str(self.base / "user"), "--disable-auto-launch", "--disable-api-nodes"]
        # The pack's per-GPU report goes to the temp dir, not the user's cache.
        env = dict(os.environ, PYTHONUNBUFFERED="1", SAGETRITON_REPORT_DIR=str(self.base / "sagetriton-report"))
        self._log = open(self.log_path, "wb")  # noqa: SIM115 (closed in stop())
        self.proc = subprocess.Popen(cmd, cwd=self.comfyui, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ComfyUI exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if self.get("/system_stats", timeout=2)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"ComfyUI did not answer within {START_TIMEOUT_S} s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if getattr(self, "_log", None):
            self._log.close()
        if os.environ.get("SAGE_E2E_KEEP"):
            print(f"e2e server directory kept: {self.base}")
        else:
            shutil.rmtree(self.base, ignore_errors=True)

    def log_tail(self, n: int = 8000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def request(self, method: str, path: str, body=None, timeout: float = 30):
        """(status, body): JSON decoded when it is JSON; HTTP errors are returned, not raised."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"} if data else {})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                code, raw, ctype = r.status, r.read(), r.headers.get("Content-Type", "")
        except urllib.error.HTTPError as e:
            code, raw, ctype = e.code, e.read(), e.headers.get("Content-Type", "")
        return code, (json.loads(raw) if "json" in ctype else raw.decode(errors="replace"))

    def get(self, path: str, timeout: float = 30):
        return self.request("GET", path, timeout=timeout)

    def post(self, path: str, body, timeout: float = 30):
        return self.request("POST", path, body, timeout=timeout)

    def run_prompt(self, prompt: dict, timeout: float = 120) -> dict:
        """Queue an API-format prompt and wait for its history entry."""
        code, answer = self.post("/prompt", {"prompt": prompt, "client_id": "sagetriton-e2e"})
        assert code == 200, f"prompt rejected ({code}): {answer}"
        pid = answer["prompt_id"]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            _, hist = self.get(f"/history/{pid}")
            if isinstance(hist, dict) and pid in hist and hist[pid].get("status", {}).get("completed") is not None:
                if hist[pid]["status"].get("status_str") in ("success", "error"):
                    return hist[pid]
            time.sleep(0.25)
        raise TimeoutError(f"prompt {pid} did not finish in {timeout} s:\n{self.log_tail()}")


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


_SERVER: ComfyServer | None = None


@pytest.fixture(scope="session")
def comfy_server(comfyui_path, request):
    global _SERVER
    if _SERVER is None:
        server = ComfyServer(comfyui_path)
        try:
            server.start()
        except Exception:
            server.stop()
            raise
        _SERVER = server
        request.addfinalizer(server.stop)
    if _SERVER.proc.poll() is not None:
        pytest.fail(f"the e2e ComfyUI server died:\n{_SERVER.log_tail()}")
    return _SERVER
