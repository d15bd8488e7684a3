"""A real ComfyUI server on CPU with this pack installed, for tests (shared: routes, UI, workflows).

    from comfy_server import comfy_server

    with comfy_server(comfyui_path) as srv:          # or the ``comfy_server_fixture`` helper below
        srv.get_json("/sage/status")

Everything ComfyUI writes goes to a temp base/output/user directory; the pack is symlinked into
``<tmp>/custom_nodes``. Nothing is written inside the ComfyUI folder.
"""
from __future__ import annotations

import contextlib
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
from dataclasses import dataclass
from pathlib import Path

from sagetriton_import import PACK_DIR

PACK_FOLDER_NAME = "ComfyUI-SageTriton"  # the folder name users get from git clone / ComfyUI-Manager


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class ComfyServer:
    url: str
    process: subprocess.Popen
    base: Path  # temp base directory (custom_nodes/, models/, input/)
    output: Path
    user: Path
    log_path: Path
    env: dict

    def get(self, path: str, timeout: float = 30.0):
        """(status, body bytes) of GET ``path``; HTTP errors are returned, not raised."""
        try:
            with urllib.request.urlopen(self.url + path, timeout=timeout) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def get_json(self, path: str, timeout: float = 30.0):
        status, body = self.get(path, timeout)
        if status != 200:
            raise AssertionError(f"GET {path} -> HTTP {status}: {body[:500]!r}\n--- server log ---\n{self.log()}")
        return json.loads(body)

    def post_json(self, path: str, data: dict, timeout: float = 30.0):
        req = urllib.request.Request(self.url + path, data=json.dumps(data).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            body = e.read()
            try:
                return e.code, json.loads(body)
            except ValueError:
                return e.code, body

    def log(self, tail: int = 12000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-tail:]
        except OSError:
            return ""


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=15)


@contextlib.contextmanager
def comfy_server(comfyui_path, pack_dir: Path = PACK_DIR, extra_args=(), env: dict | None = None,
                 startup_timeout: float = 180.0, keep_tmp: bool = False):
    """Start ``main.py --cpu`` on a free port with the pack installed; stop it and clean up on exit.

    ``env`` entries are added to the server's environment (e.g. ``{"SAGETRITON_REPORT_DIR": ...}``);
    ``SAGETRITON_REPORT_DIR`` defaults to a temp folder so the pack's report never lands in the checkout.
    """
    tmp = Path(tempfile.mkdtemp(prefix="sage-comfy-"))
    base, output, user = tmp / "base", tmp / "output", tmp / "user"
    for d in (base / "custom_nodes", output, user):
        d.mkdir(parents=True)
    os.symlink(Path(pack_dir).resolve(), base / "custom_nodes" / PACK_FOLDER_NAME, target_is_directory=True)
    port = free_port()
    server_env = dict(os.environ)
    server_env.setdefault("SAGETRITON_REPORT_DIR", str(tmp / "sage-report"))
    server_env.update(env or {})
    server_env["PYTHONUNBUFFERED"] = "1"
    cmd = [sys.executable, "main.py", "--cpu", "--listen", "127.0.0.1", "--port", str(port),
           "--base-directory", str(base), "--output-directory", str(output), "--user-directory", str(user),
           "--disable-auto-launch", *extra_args]
    log_path = tmp / "server.log"
    log = open(log_path, "wb")  # noqa: SIM115 - closed in finally
    proc = subprocess.Popen(cmd, cwd=str(comfyui_path), stdout=log, stderr=subprocess.STDOUT, env=server_env)
    srv = ComfyServer(f"http://127.0.0.1:{port}", proc, base, output, user, log_path, server_env)
    try:
        deadline = time.monotonic() + startup_timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"ComfyUI exited with code {proc.returncode} during start-up:\n{srv.log()}")
            try:
                if srv.get("/system_stats", timeout=2)[0] == 200:
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"ComfyUI did not answer within {startup_timeout:.0f} s:\n{srv.log()}")
            time.sleep(0.5)
        yield srv
    finally:
        _stop(proc)
        log.close()
        if not keep_tmp:
            shutil.rmtree(tmp, ignore_errors=True)
