"""Ctrl-C for every `kvroute` command: one line on stderr and exit status 130, never a traceback.

A command stops what it started in its own `finally` blocks while the KeyboardInterrupt unwinds
(local clusters, the simulator's worker processes); `run_command` catches it at the top, says so in
one line and returns 130, what a shell reports for a command stopped by SIGINT. Servers stop on
SIGINT through their event loop instead (serve.py) and exit 130 too. Worker processes that share
the terminal's process group ignore SIGINT (`ignore_interrupts`): their parent stops them, and
only the parent says anything.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable

INTERRUPTED = 130  # 128 + SIGINT


def interrupted(prog: str, what: str = "interrupted") -> int:
    """After Ctrl-C: ignore another one (exit handlers still stopping processes finish), say `what`
    in one line on stderr; the exit status."""
    ignore_interrupts()
    print(f"{prog}: {what}", file=sys.stderr, flush=True)
    return INTERRUPTED


def run_command(prog: str, main: Callable[[list[str] | None], int | None], argv: list[str] | None = None) -> int:
    """`main(argv)`'s exit status, or 130 after one line when Ctrl-C interrupts it."""
    try:
        return int(main(argv) or 0)
    except KeyboardInterrupt:
        return interrupted(prog)


def ignore_interrupts() -> None:
    """SIGINT ignored from now on in this process (the main thread's business only)."""
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the main thread: the handler stays where it was
        pass
