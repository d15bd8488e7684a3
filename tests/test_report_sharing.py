"""Issue 31 items 6 and 7: reports readable by other accounts (0644), found in a read-only pack folder, and
kept side by side per (arch, torch, triton, pack) in a shared folder."""
import json
import os
import shutil
import stat
import subprocess
import sys

import pytest

from sagetriton_import import PACK_DIR


def _ada():
    from sagetriton.kernels.arch import ArchInfo

    return ArchInfo("nvidia", "sm89", "ada", "RTX 4090", 32, "e4m3fn")


def test_report_is_readable_by_other_accounts(rep):
    path = rep.save_report(rep.new_report(rep.report_key(_ada(), "2.9.0", "3.5.0")))
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_installs_sharing_a_folder_keep_their_reports(rep, tmp_path):
    """Two ComfyUIs (another torch, another triton) on one ~/.cache/sagetriton: alternate starts find theirs."""
    keys = [rep.report_key(_ada(), t, tr) for t, tr in (("2.9.0", "3.5.0"), ("2.10.0", "3.5.0"), ("2.9.0", "3.6.0"))]
    for _round in range(2):
        for key in keys:
            if rep.load_report(key) is None:
                r = rep.new_report(key)
                r["complete"] = True
                rep.save_report(r)
    assert len(list(tmp_path.glob("report-sm89-*.json"))) == 3
    assert all(rep.load_report(k)["created"] for k in keys)


# Run in a copy of the pack: writes (as install.py would) or reads the simulated Ada's report, no report dir set.
CHILD = r"""
import json, sys
from sagetriton_import import import_pack
import_pack(run_init=False, pack_dir=__import__("pathlib").Path(sys.argv[1]))
from sagetriton.installer import report as rep
from sagetriton.kernels.arch import ArchInfo
key = rep.report_key(ArchInfo("nvidia", "sm89", "ada", "RTX 4090", 32, "e4m3fn"))
if sys.argv[2] == "write":
    r = rep.new_report(key); r["crossover"] = {"seq_len": 2048}; r["complete"] = True
    print(json.dumps({"path": str(rep.save_report(r))}))
else:
    r, problem = rep.read_report(key)
    print(json.dumps({"found": r is not None, "problem": problem, "write_dir": str(rep.report_dir())}))
"""


def test_report_in_a_read_only_pack_folder_is_used(tmp_path):
    if shutil.which("chattr") is None:
        pytest.skip("needs chattr to make a folder read-only for root too")
    copy = tmp_path / "ComfyUI-SageTriton"
    shutil.copytree(PACK_DIR, copy, ignore=shutil.ignore_patterns(".*", "tests", "docs", "bench",
                                                                   "web", "workflows", "__pycache__", "*.png"))
    env = {k: v for k, v in os.environ.items() if k not in ("SAGETRITON_REPORT_DIR", "TRITON_INTERPRET")}
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")

    def child(mode):
        proc = subprocess.run([sys.executable, "-c", CHILD, str(copy), mode], cwd=str(copy), env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    written = child("write")  # install.py, run by the account that owns the pack folder
    assert written["path"].startswith(str(copy / ".sagetriton"))
    local = copy / ".sagetriton"
    if subprocess.run(["chattr", "+i", str(local)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i not permitted here")
    try:
        seen = child("read")  # ComfyUI, for which the pack folder is read-only
    finally:
        subprocess.run(["chattr", "-i", str(local)], check=True)
    assert seen["write_dir"] == str(tmp_path / "cache" / "sagetriton")  # it would write to the cache ...
    assert seen == dict(seen, found=True, problem=None)  # ... and still reads install.py's report
