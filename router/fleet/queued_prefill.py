"""When a non-streamed request's prefill is done, as the engine's own load reports say.

The router charges every request it sends an instance with its predicted uncached
prompt tokens (`queued_prefill_tokens`, the cost model's queue) until the prefill is
done. A streamed answer says so with its first byte. A non-streamed one says nothing
until the whole body arrives, after the decode too, so without help its prefill would
look queued for the whole decode and steer later requests away from an engine that
is only decoding.

kvroute engines report their own queue of prompt tokens not yet prefilled
(`LoadRecord.queued_prefill_tokens`, at wall time `ts`). Engines prefill in arrival
order, so of the non-streamed requests sent before the record was measured, the
newest ones make up whatever the engine still has queued; the older ones are done.
`release(load)` walks them newest first, keeps them while the tokens kept are below
the engine's queue, and returns the rest: their prefill is over. Requests sent less
than `margin_s` before `ts` are left alone (they may still be on the wire, and the
two clocks may differ by that much). Only for engine kinds whose load reports the
queue (kvroute); others keep the old rule (released when the answer arrives).
"""

from __future__ import annotations

import time
from typing import Protocol

from kvroute.router.contract.protocol import LoadRecord

MARGIN_S = 0.05


class Pending(Protocol):
    uncached: int
    first_seen: bool

    def first_byte(self, is_ttft: bool = True) -> None: ...


class QueuedPrefill:
    def __init__(self, margin_s: float = MARGIN_S) -> None:
        self.margin_s = margin_s
        self._sent: list[tuple[float, Pending]] = []  # oldest first

    def __len__(self) -> int:
        return len(self._sent)

    def add(self, dispatch: Pending, now: float | None = None) -> None:
        self._sent.append((time.time() if now is None else now, dispatch))

    def release(self, load: LoadRecord) -> list[Pending]:
        """The dispatches whose prefill `load` shows done (each returned once). The ones answered
        already leave the queue here, wherever they are in it, so each load report walks only the
        requests not yet answered or released (a request in flight at the front would otherwise
        keep every answered one behind it, and every report would walk them all again)."""
        sent = [(t, d) for t, d in self._sent if not d.first_seen]
        cutoff = load.ts - self.margin_s
        older = [d for t, d in sent if t <= cutoff]
        done = []
        if older:
            kept = 0
            for d in reversed(older):
                if kept < load.queued_prefill_tokens:
                    kept += d.uncached
                else:
                    done.append(d)
        if done:
            gone = set(map(id, done))
            sent = [(t, d) for t, d in sent if id(d) not in gone]
        self._sent = sent
        return done
