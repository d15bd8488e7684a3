"""What this process learned at run time, in one object with one reset: what failed (a kernel variant, Hopper's
Gluon kernel, the RoPE kernel, a direct launch), what was proven to work (a variant's container path), and
the replays recorded or refused.

Everything here lasts until ComfyUI restarts (a failure is not retried on every call); ``reset()`` forgets it
all at once (tests, and a caller that wants a fresh start). The kernel library keeps its own entries here
(``hopper_host``, ``launcher``, ``replay``); the nodes keep theirs (``routing.dispatch``, ``routing.containers``,
``routing.rope_hooks``), since the library must not import the nodes. Each reads the attribute on every use,
so a reset, or a test's ``monkeypatch.setattr(memory, ...)``, is seen at once.
"""
from __future__ import annotations

import threading
from typing import Optional


class ProcessMemory:
    """The one place run-time failure state lives. Fields, each with its owner:

    - ``variants``: kernel variant key -> why it failed; that variant is off (``routing.dispatch``).
    - ``proven_variants``: variant keys whose quantized container path ran once (``routing.containers``).
    - ``gluon`` / ``gluon_lse`` / ``gluon_kcols``: why Hopper's Gluon kernel (its LSE twins alone, its variant with a K
      scale per key alone) could not run (``hopper_host``).
    - ``rope``: why the RoPE kernel failed; ComfyUI's RoPE from then on (``routing.rope_hooks``).
    - ``direct_launch``: kernel -> why its direct launches are off (``launcher``).
    - ``replays`` / ``refused_replays``: recorded calls by key, oldest first, and keys too large to keep
      (``replay``; changed as a whole under ``lock``).
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.variants: dict = {}
        self.proven_variants: set = set()
        self.gluon: Optional[str] = None
        self.gluon_lse: Optional[str] = None
        self.gluon_kcols: Optional[str] = None
        self.rope: Optional[str] = None
        self.direct_launch: dict = {}
        self.replays: dict = {}
        self.refused_replays: dict = {}

    def reset(self) -> None:
        """Forget everything: every failure is tried again, every replay recorded again."""
        with self.lock:
            for table in (self.variants, self.proven_variants, self.direct_launch, self.replays,
                          self.refused_replays):
                table.clear()
            self.gluon = self.gluon_lse = self.gluon_kcols = self.rope = None


memory = ProcessMemory()


def reset() -> None:
    """``memory.reset()``: the one reset of this process's run-time failure state."""
    memory.reset()
