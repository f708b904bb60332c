"""Malformed requests (a head the HTTP parser refuses: bad request line, missing or duplicate Host,
too many headers, bare LF line ends, ...): counted by reason, and logged once per window per reason
with one example and how many more came since the last line, never a traceback each; a client
sending thousands of them writes a few lines of log, not megabytes."""

from __future__ import annotations

import collections
import logging
import re
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

WINDOW_S = 60.0
DETAIL_CHARS = 160


def reason_of(exc: BaseException) -> str:
    """The metric label of an error: its class name in snake case (`BadHttpMessage` -> bad_http_message),
    one of the parser's few error classes."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", type(exc).__name__).lower()


class MalformedLog:
    def __init__(self, window_s: float = WINDOW_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self.clock = clock
        self.counts: collections.Counter[str] = collections.Counter()  # reason -> requests, ever
        self._logged_at: dict[str, float] = {}
        self._unlogged: collections.Counter[str] = collections.Counter()

    def note(self, exc: BaseException, peer: str) -> None:
        reason = reason_of(exc)
        self.counts[reason] += 1
        now = self.clock()
        last = self._logged_at.get(reason)
        if last is not None and now - last < self.window_s:
            self._unlogged[reason] += 1
            return
        self._logged_at[reason] = now
        more = self._unlogged.pop(reason, 0)
        detail = " ".join(str(getattr(exc, "message", exc)).split())[:DETAIL_CHARS]
        log.warning("malformed request from %s (%s): %s%s", peer, reason, detail,
                    f" [{more} more since the last such line]" if more else "")
