"""Run Python code in a child process and report how it ended, whatever happens to the child.

Used where a GPU-side assertion or a driver fault would kill the process that triggered it
(torch's SDPA on RDNA4): the child dies, the parent reads the exit status and carries on.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from typing import Optional

RESULT_MARK = "SAGE_RESULT "  # the child prints one line "SAGE_RESULT <json>" as its answer
# Windows reports a crashed process as an NTSTATUS exit code, not a signal.
_NTSTATUS = {0xC0000005: "an access violation", 0xC0000409: "a fatal error (abort / stack buffer overrun)",
             0xC000001D: "an illegal instruction", 0xC00000FD: "a stack overflow"}


@dataclass
class ChildResult:
    returncode: Optional[int]  # None when it was killed for running past the timeout
    stdout: str
    stderr: str
    timed_out: bool = False
    payload: Optional[dict] = None  # the child's SAGE_RESULT json, when it got that far

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and self.payload is not None

    def describe(self) -> str:
        """One line saying how the child ended, for reports and logs."""
        if self.timed_out:
            return "the child process hung and was stopped after the timeout"
        if self.returncode and (self.returncode & 0xFFFFFFFF) in _NTSTATUS:
            return f"the child process died of {_NTSTATUS[self.returncode & 0xFFFFFFFF]}" + self._stderr_hint()
        if self.returncode is not None and self.returncode < 0:
            try:
                name = signal.Signals(-self.returncode).name
            except ValueError:
                name = f"signal {-self.returncode}"
            return f"the child process was killed by {name}" + self._stderr_hint()
        if self.returncode:
            return f"the child process exited with code {self.returncode}" + self._stderr_hint()
        if self.payload is None:
            return "the child process exited without a result" + self._stderr_hint()
        return "ok"

    def _stderr_hint(self) -> str:
        lines = [ln for ln in self.stderr.strip().splitlines() if ln.strip()]
        return f": {lines[-1][:300]}" if lines else ""


def run_python_child(code: str, timeout: float = 120.0, env: Optional[dict] = None,
                     args: tuple = ()) -> ChildResult:
    """Run ``python -c code *args``; never raises for anything the child does."""
    child_env = dict(os.environ)
    child_env.update(env or {})
    try:
        proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                              timeout=timeout, env=child_env, errors="replace")
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        return ChildResult(None, out, err, timed_out=True)
    payload = None
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_MARK):
            try:
                payload = json.loads(line[len(RESULT_MARK):])
            except ValueError:
                pass
            break
    return ChildResult(proc.returncode, proc.stdout, proc.stderr, payload=payload)
