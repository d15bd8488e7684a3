"""Progress for long steps: a tqdm bar on a terminal, one plain line per step otherwise.

ComfyUI-Manager and log files capture output without a terminal, where a redrawn bar turns into
a wall of carriage returns.
"""
from __future__ import annotations

import sys


class _Lines:
    def __init__(self, total: int, desc: str, initial: int = 0) -> None:
        self.n, self.total, self.desc, self.postfix = initial, total, desc, ""

    def update(self, k: int = 1) -> None:
        self.n += k
        print(f"{self.desc}: {self.n}/{self.total} {self.postfix}".rstrip(), file=sys.stderr, flush=True)

    def set_postfix_str(self, s: str) -> None:
        self.postfix = s

    def close(self) -> None:
        pass


def progress_bar(total: int, desc: str, initial: int = 0, unit: str = "step"):
    if sys.stderr.isatty():
        from tqdm import tqdm

        return tqdm(total=total, initial=initial, desc=desc, unit=unit, file=sys.stderr)
    return _Lines(total, desc, initial)
