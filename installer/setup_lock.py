"""One self-test per report key at a time, across processes (two ComfyUIs sharing custom_nodes, install.py
during a first start): a lock file holding the owner's pid; a dead owner's lock is taken over."""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Optional

from .leftovers import pid_alive as _pid_alive

WORKER_TIMEOUT = 3600.0  # the setup worker's whole stage (``firststart.run_worker_stage``); its lock outlives it
LOCK_STALE_AFTER = WORKER_TIMEOUT * 1.5  # where a pid cannot be checked (Windows), age decides


def lock_holder(lock: Path) -> Optional[int]:
    """The pid of the live process holding ``lock`` (0: one that is writing it now), or None (free or stale)."""
    try:
        age = time.time() - lock.stat().st_mtime
    except OSError:
        return None
    try:
        pid = int(lock.read_text().split()[0])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, IndexError):  # no pid yet: its holder is between creating and writing it
        return 0 if age < 10 else None
    return pid if pid > 0 and _pid_alive(pid) and age < LOCK_STALE_AFTER else None


def try_lock(lock: Path) -> bool:
    """Take ``lock`` for this process; False while another live process holds it."""
    for _ in range(3):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            if lock_holder(lock) is not None:
                return False
            try:  # stale: move it aside atomically, so two processes cannot both take it over
                os.replace(lock, lock.with_name(f"{lock.name}.stale-{os.getpid()}"))
                os.unlink(lock.with_name(f"{lock.name}.stale-{os.getpid()}"))
            except OSError:
                pass
            continue
        with os.fdopen(fd, "w") as f:
            f.write(f"{os.getpid()}\n")
        return True
    return False


def release_lock(lock: Path) -> None:
    try:
        if lock.read_text().split()[0] == str(os.getpid()):
            lock.unlink()
    except (OSError, IndexError):
        pass


# ---------------------------------------------------------------------------------------------
