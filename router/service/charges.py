"""Everything a request charges, and the one owner that releases it (docs/architecture.md#one-owner-per-charge).

A request charges, in this order:

  1. its tenant's slot: a place in its concurrency limit and a token of its rate limit, taken
     before it is tokenized (router/service/admission_gate.py `reserve`) and held until it ends;
  2. for each attempt, the chosen instance's in-flight count and queued prefill tokens, and the
     policy's record of the request there (`Dispatch`).

`Charges` owns them from the moment each is made. The code that ends a charge in the normal
course releases it (a first byte the prefill, the end of a relay the in-flight count, a retry
its attempt); whatever fails, `close` releases what is left, once. The HTTP entry
(router/service/entry.py) closes it in a `finally` around the whole span, from the tenant's slot
to the last byte; a caller that only decides and lets another part send (an endpoint picker)
keeps the owner with the request and closes it when it hears the request ended.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger(__name__)


class Slot(Protocol):
    """A tenant's slot for one request (router/service/admission_gate.py `AdmissionGate`)."""

    def reserve(self, ticket) -> None: ...

    def release(self, ticket, first_token: float | None) -> None: ...


def _nothing() -> None:
    return None


class Dispatch:
    """Router-side load of one request on one instance, from dispatch to the end."""

    def __init__(self, router, prepared, choice, whole_body: bool = False,
                 on_progress: Callable[[], None] = _nothing) -> None:
        """`whole_body`: a non-streamed answer; where the engine reports its prefill queue, the
        prefill is released by its load reports (router/fleet/queued_prefill.py), not by the body.
        `on_progress`: its prefill was seen done, or it ended (the admission gate's news)."""
        self.router, self.prepared, self.choice = router, prepared, choice
        self.on_progress = on_progress
        self.inst = choice.instance
        self.uncached = choice.uncached_tokens
        self.sent = time.monotonic()
        self.first_seen = False
        self.ended = False
        self.inst.charge(1, self.uncached)
        if whole_body and self.uncached and self.inst.kind == "kvroute":
            self.inst.nonstreamed.add(self)

    def _release_prefill(self) -> bool:
        """Stop charging the instance with this request's prefill; False if that happened already
        (once only: a first byte, a load report and the end may each try)."""
        if self.first_seen:
            return False
        self.first_seen = True
        self.inst.charge(0, -self.uncached)
        return True

    def first_byte(self, is_ttft: bool = True) -> None:
        """The prefill is done. `is_ttft=False` for whole (non-streamed) bodies, whose arrival
        time includes the decode and must not teach the policy a prefill rate."""
        if not self._release_prefill():
            return
        self.on_progress()
        if is_ttft:
            ttft = time.monotonic() - self.sent
            self.router.metrics.observe_first_token(self.prepared.model, self.inst.id, ttft)
            self.router.policy.on_first_token(self.prepared.route, self.inst.id, ttft, self.uncached)

    def end(self, status: str) -> None:
        if self.ended:
            return
        self.ended = True
        self._release_prefill()  # a request that failed, was retried or cancelled before its prefill was seen
        self.inst.charge(-1, 0)
        try:  # the instance is released above; what only records the end cannot hold it
            self.router.metrics.count_request(self.inst.id, self.router.policy_name, status)
            self.router.policy.on_finished(self.prepared.route, self.inst.id)
        finally:
            self.on_progress()


class Charges:
    """The owner of one request's charges: its tenant's slot and its attempts' dispatches."""

    __slots__ = ("slot", "ticket", "dispatches", "closed")

    def __init__(self, slot: Slot, ticket) -> None:
        self.slot, self.ticket = slot, ticket
        self.dispatches: list[Dispatch] = []
        self.closed = False

    def reserve(self) -> None:
        """Take the tenant's slot (Overloaded when its limits refuse): from here `close` gives it back."""
        self.slot.reserve(self.ticket)

    def dispatch(self, router, prepared, choice, whole_body: bool = False) -> Dispatch:
        """Charge `choice`'s instance with the request (a `Dispatch`), owned here until it ends."""
        if self.closed:
            raise RuntimeError("a request's charges were closed before its last dispatch")
        dispatch = Dispatch(router, prepared, choice, whole_body, on_progress=router.on_progress)
        self.dispatches.append(dispatch)
        return dispatch

    def close(self, status: str, first_token: float | None = None) -> None:
        """Release whatever is still charged: every dispatch not yet ended (under `status`), then the
        tenant's slot (`first_token`: when the client got it, for admission's calibration). Once;
        a dispatch whose end fails is logged and the others are still released."""
        if self.closed:
            return
        self.closed = True
        try:
            for dispatch in self.dispatches:
                try:
                    dispatch.end(status)
                except Exception:
                    log.exception("ending a dispatch on %s failed; its charges are released", dispatch.inst.id)
        finally:
            self.dispatches.clear()
            self.slot.release(self.ticket, first_token)
