"""``install.py --provide-sageattention``: a ``sageattention`` distribution backed by this pack's kernels.

Opt-in. Into the site-packages of the Python that runs install.py it writes a small package
``sageattention/`` (which imports ``kernels.sageattention_compat`` from this pack's folder) and its
``sageattention-<version>.dist-info`` (METADATA, RECORD, INSTALLER), so ``import sageattention``,
``importlib.metadata.version("sageattention")`` (diffusers wants >= 2.1.1) and ``pip uninstall`` all
see an ordinary installed distribution. It never goes over or in front of a real SageAttention: if any
``sageattention`` module or distribution is already visible to that Python, nothing is written and
the message says where it is. ``--remove-sageattention`` removes only what this file wrote (the
dist-info's ``sagetriton.json`` says so). No network, no pip.
"""
from __future__ import annotations

import base64
import csv
import hashlib
import importlib.metadata
import importlib.util
import io
import json
import os
import shutil
import sysconfig
import tempfile
from pathlib import Path
from typing import Optional

NAME = "sageattention"
API_VERSION = "2.2.0"  # kernels.sageattention_compat.__version__ (read without importing torch)
VERSION = f"{API_VERSION}+sagetriton"  # a local version: >= 2.1.1, and says whose it is
MARKER = "sagetriton.json"  # in the dist-info: this file wrote it, and from which pack folder
PACK_DIR = Path(__file__).resolve().parent.parent

_SHIM = '''"""SageAttention's API on the SageTriton ComfyUI pack's Triton kernels (its drop-in distribution).

Installed by ``install.py --provide-sageattention`` from {pack!r}; removed by
``install.py --remove-sageattention`` (or ``pip uninstall sageattention``). Not the CUDA SageAttention.
"""
import importlib.util as _util
import os as _os
import sys as _sys

PACK_DIR = {pack!r}
__version__ = {version!r}


def _compat():
    entry = _os.path.join(PACK_DIR, "sagetriton_import.py")
    if not _os.path.isfile(entry):
        raise ImportError("sageattention (SageTriton's drop-in): the pack it was installed from is gone (" + PACK_DIR
                          + "): run install.py --provide-sageattention from the pack again, or "
                          "pip uninstall sageattention", name="sageattention")
    if "sagetriton" not in _sys.modules:
        spec = _util.spec_from_file_location("_sagetriton_import_for_sageattention", entry)
        loader = _util.module_from_spec(spec)
        spec.loader.exec_module(loader)
        loader.import_pack(run_init=False, pack_dir=PACK_DIR)  # the kernels only: no ComfyUI nodes
    from sagetriton.kernels import sageattention_compat

    return sageattention_compat


_c = _compat()
sageattn = _c.sageattn
sageattn_qk_int8_pv_fp16_triton = _c.sageattn_qk_int8_pv_fp16_triton
sageattn_qk_int8_pv_fp16_cuda = _c.sageattn_qk_int8_pv_fp16_cuda
sageattn_qk_int8_pv_fp8_cuda = _c.sageattn_qk_int8_pv_fp8_cuda
sageattn_qk_int8_pv_fp8_cuda_sm90 = _c.sageattn_qk_int8_pv_fp8_cuda_sm90
sageattn_varlen = _c.sageattn_varlen
__all__ = _c.__all__
'''


def site_dir() -> Path:
    """Where this Python installs pure-Python packages (a venv's own site-packages inside a venv)."""
    return Path(sysconfig.get_paths()["purelib"])


def _ours(dist_info: Path) -> Optional[dict]:
    """The marker of a dist-info this file wrote, or None (someone else's, or unreadable)."""
    try:
        data = json.loads((dist_info / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("name") == NAME else None


def _dist_infos(target: Path) -> list:
    return sorted(p for p in target.glob("*.dist-info") if p.name.lower().startswith(f"{NAME}-"))


def find_other() -> Optional[str]:
    """A ``sageattention`` this Python already sees that is not this pack's drop-in, as one phrase; None if none."""
    importlib.invalidate_caches()
    for dist in importlib.metadata.distributions(name=NAME):
        path = getattr(dist, "_path", None)
        if path is None or _ours(Path(path)) is None:
            where = f" at {Path(str(path)).parent}" if path is not None else ""
            return f"SageAttention {dist.version}{where}"
    try:
        spec = importlib.util.find_spec(NAME)
    except (ImportError, ValueError):
        spec = None
    if spec is not None:
        origin = Path(spec.origin or next(iter(spec.submodule_search_locations or []), ""))
        package = origin.parent if origin.name == "__init__.py" else origin
        if not any(_ours(d) for d in _dist_infos(package.parent)):
            return f"a sageattention module at {package}"
    return None


def installed(target: Optional[Path] = None) -> Optional[dict]:
    """The drop-in's marker in ``target`` (default: this Python's site-packages), None if it is not there."""
    target = Path(target or site_dir())
    for d in _dist_infos(target):
        marker = _ours(d)
        if marker is not None:
            return {**marker, "dist_info": str(d)}
    return None


def _is_shim(package: Path) -> bool:
    try:
        return package.is_dir() and (package / "__init__.py").read_text(encoding="utf-8").startswith(_SHIM[:60])
    except OSError:
        return False


def _record_line(rel: str, data: bytes) -> list:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return [rel, f"sha256={digest}", str(len(data))]


def _files(pack_dir: Path) -> dict:
    """Relative path -> bytes of everything the distribution holds but its RECORD."""
    dist = f"{NAME}-{VERSION}.dist-info"
    metadata = (f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {VERSION}\n"
                f"Summary: SageAttention's API on the SageTriton ComfyUI pack's Triton kernels ({pack_dir})\n"
                "License: see the SageTriton pack\n")
    return {
        f"{NAME}/__init__.py": _SHIM.format(pack=str(pack_dir), version=API_VERSION).encode(),
        f"{dist}/METADATA": metadata.encode(),
        f"{dist}/INSTALLER": b"sagetriton\n",
        f"{dist}/top_level.txt": f"{NAME}\n".encode(),
        f"{dist}/{MARKER}": json.dumps({"name": NAME, "version": VERSION, "pack_dir": str(pack_dir)}).encode(),
    }


def install(target: Optional[Path] = None, pack_dir: Path = PACK_DIR, check_others: bool = True) -> tuple[bool, str]:
    """Write the drop-in into ``target`` (default: this Python's site-packages). Returns (ok, what happened).
    ``check_others=False``: a benchmark's own folder put first on its path, beside a reference build."""
    target = Path(target or site_dir())
    other = find_other() if check_others else None
    if other is not None:
        return False, (f"{other} is already installed for this Python: left as it is, and the drop-in was not "
                       "installed (it would replace or hide it). Nodes and engines that import sageattention use that "
                       "one; remove it first if you want SageTriton's kernels there.")
    previous = installed(target)
    if previous is not None and previous.get("pack_dir") == str(pack_dir) and previous.get("version") == VERSION:
        return True, f"the sageattention drop-in {VERSION} is already installed in {target}"
    try:
        target.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".sagetriton-dropin-", dir=target))
    except OSError as e:
        return False, f"cannot write to {target} ({e.strerror or e}): run install.py as the user who owns this Python"
    try:
        files = _files(pack_dir)
        rows = []
        for rel, data in files.items():
            (staging / rel).parent.mkdir(parents=True, exist_ok=True)
            (staging / rel).write_bytes(data)
            rows.append(_record_line(rel, data))
        dist = f"{NAME}-{VERSION}.dist-info"
        out = io.StringIO()
        csv.writer(out, lineterminator="\n").writerows(rows + [[f"{dist}/RECORD", "", ""]])
        (staging / dist / "RECORD").write_text(out.getvalue(), encoding="utf-8")
        if previous is not None:  # an older drop-in (another version or pack folder): replaced
            remove(target)
        # The package, then the dist-info that makes it visible: a reader never sees metadata without code.
        os.replace(staging / NAME, target / NAME)
        os.replace(staging / dist, target / dist)
    except OSError as e:
        return False, f"could not install the sageattention drop-in into {target}: {e}"
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    importlib.invalidate_caches()
    return True, (f"installed sageattention {VERSION} into {target}: `import sageattention` now runs SageTriton's "
                  f"kernels (from {pack_dir}). To install the CUDA SageAttention later, run "
                  "install.py --remove-sageattention first (pip would take this one as installed).")


def remove(target: Optional[Path] = None) -> tuple[bool, str]:
    """Remove the drop-in from ``target`` (default: this Python's site-packages); never anything else."""
    target = Path(target or site_dir())
    mine = [d for d in _dist_infos(target) if _ours(d) is not None]
    if not mine:
        other = find_other()
        if other is not None:
            return False, f"{other} is not SageTriton's drop-in: left as it is"
        return True, f"no sageattention drop-in in {target}: nothing to remove"
    try:
        package = target / NAME
        if _is_shim(package):  # a package someone else put there since is left alone
            shutil.rmtree(package)
        for d in mine:
            shutil.rmtree(d)
    except OSError as e:
        return False, f"could not remove the sageattention drop-in from {target}: {e}"
    importlib.invalidate_caches()
    return True, f"removed SageTriton's sageattention drop-in from {target}"
