"""Files a killed self-test leaves behind: which processes are gone, and cleaning up after them."""
from __future__ import annotations

import os
import re
from pathlib import Path

# A supervisor's progress file and its temp files: .worker-<key id>-<supervisor pid>.json / .<pid>.tmp
_WORKER_FILE = re.compile(r"\.worker-[0-9a-f]+-(\d+)\..+")


def pid_alive(pid: int) -> bool:
    if os.name == "nt":
        return True  # os.kill(pid, 0) would terminate it there; the lock's age decides instead
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (dead, not yet reaped) holds nothing
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def clean_stale_workers(d: Path) -> list:
    """Remove the progress and temp files of self-tests whose supervisor is gone (a killed install.py or
    ComfyUI), for any report key; returns the paths removed. A live supervisor's files stay."""
    removed = []
    for left in d.glob(".worker-*"):
        m = _WORKER_FILE.fullmatch(left.name)
        if m is None or pid_alive(int(m.group(1))):
            continue
        try:
            left.unlink()
            removed.append(left)
        except OSError:
            pass
    return removed
