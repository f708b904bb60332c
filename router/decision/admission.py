"""Admission by predicted TTFT: admit now, wait in the router's queue, or refuse at once.

Pure and synchronous, the clock an argument: the router service (router/service/admission_gate.py)
and the simulator (loadgen/sim/admission.py) call the same functions (docs/architecture.md#one-decision-two-drivers).

A request carries its SLO on time to first token; `predicted_s` is the best candidate's
predicted TTFT now (the policy's wait + own prefill terms, router/decision/policies/kv_aware.py).
The engines may hold work up to `threshold` = SLO x (1 + margin) of predicted TTFT; beyond
it a request waits in the router's fair queue (router/decision/fair_queue.py), so the engines
keep a backlog that keeps them busy and the excess waits where it can be ordered by
priority and tenant, and refused while refusing is cheap:

    arrival   its tenant over its weighted fair share while a tenant short of its
              own asked lately, the fleet contended (`held_back`)               -> refuse 429
              nothing queued ahead (and, shared by replicas, in its turn: fleet_share.py)
              and predicted <= min(threshold, budget)                           -> admit
              the same, its tenant light (at most half its share while others
              flood: shares.py `light`) and predicted <= budget                 -> admit
              queue wait (ahead + 1) / drain rate, or the engines' excess
              predicted - threshold, plus threshold > budget                    -> refuse
              the queue full and nobody to displace                             -> refuse
              otherwise                                                         -> queue
    head      its tenant held back, as on arrival (a queue is contention)        -> refuse 429
              its tenant light and predicted <= budget                          -> admit
              not in its turn over the fleet                                    -> wait
              predicted <= min(threshold, budget)                               -> admit
              predicted > budget (an engine's backlog drains in real time, as
              fast as the budget does: it will not fit)                         -> refuse
              otherwise                                                         -> wait
    queued    the budget below the threshold (expires_at)                        -> refuse

`budget` is the SLO less the time waited. When nothing of a tenant was admitted for `probe_s`, its
next request goes anyway: predictions learn from first tokens (the prefill rate from long prompts),
and requests that are all refused would never bring the first token that corrects a pessimistic one.

The first rule is where the weights act: under a flood the queue holds about one entry, so its
order alone leaves admission first come, first served. A refusal is 429 when the tenant takes more
than its weighted fair share of what the fleet admitted lately (it should slow down), else 503 (the
fleet is saturated); Retry-After is the queue wait beyond what the budget allows, at least 1 s.
Nothing admitted is refused afterwards.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import TypedDict

import msgspec

from kvroute.router.contract.constraints import NOT_NEGATIVE, POSITIVE, Range
from kvroute.router.contract.settings import check_settings, setting
from kvroute.router.decision.base import Decision
from kvroute.router.decision.decay import decayed
from kvroute.router.decision.fair_queue import FairQueue, QueueEntry
from kvroute.router.decision.shares import Fair, Rates

ADMIT, QUEUE, WAIT, REFUSE = "admit", "queue", "wait", "refuse"


def _edges(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ValueError(f"priorities are integers, comma-separated, got {text!r}") from None


@dataclasses.dataclass(frozen=True, slots=True)
class AdmissionConfig:
    """admission (docs/admission.md)"""

    slo_ttft_s: float | None = setting(None, "the default TTFT SLO; requests predicted to miss it wait or are "
                                             "refused with 429/503 + Retry-After", check=POSITIVE, default_text="off")
    margin: float = setting(-0.4, "engines may hold predicted TTFT up to SLO x (1 + margin) before requests wait in "
                                  "the router's queue", flag="admission-margin", check=Range(-1, 1, open_low=True))
    max_queue: int = setting(1024, "requests that may wait in the router's queue (all tenants)",
                             flag="admission-queue", check=NOT_NEGATIVE)
    priority_edges: tuple[int, ...] = setting((0, 1), "priority bands cut at these priorities (lower is more urgent; "
                                                      "at most 7, increasing)", parse=_edges, metavar="P,P")
    drain_halflife_s: float = 2.0  # half-life of the admitted-rate estimate (the drain rate)
    min_drain_rps: float = 1.0  # the drain rate assumed before anything was admitted
    probe_s: float = 1.0  # nothing admitted this long: the next request goes anyway, so predictions relearn
    recent_s: float = 0.5  # a tenant that asked this lately still wants its share (shares.py `held_back`)

    def __post_init__(self) -> None:
        check_settings(self)
        if list(self.priority_edges) != sorted(set(self.priority_edges)) or len(self.priority_edges) > 7:
            raise ValueError(f"priority band edges must be increasing, at most 7, got {self.priority_edges}")
        if min(self.drain_halflife_s, self.min_drain_rps, self.probe_s, self.recent_s) <= 0:
            raise ValueError("drain_halflife_s, min_drain_rps, probe_s and recent_s must be positive")

    @property
    def bands(self) -> int:
        return len(self.priority_edges) + 1


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Ask:
    """One request asking to be admitted, as the decision sees it."""

    tenant: str
    band: int
    weight: float
    slo_s: float
    arrived: float  # on the caller's clock
    predicted_s: float | None  # the best candidate's predicted TTFT now; None: no prediction (admit)
    prefill_s: float = 0.0  # of which its own prefill: the threshold is never below it


class _Common(TypedDict):  # what every verdict of one decision says of the request
    budget_s: float
    threshold_s: float


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Verdict:
    action: str  # ADMIT, QUEUE (arrival), WAIT (queued head), REFUSE
    reason: str  # fits, engines_busy, queued_ahead, over_share, saturated, queue_full, deadline, displaced, ...
    status: int = 0  # refusals: 429 or 503
    retry_after_s: float = 0.0
    wait_s: float = 0.0  # the estimated queue wait
    budget_s: float = 0.0
    threshold_s: float = 0.0
    displace: QueueEntry | None = None  # QUEUE into a full queue: the entry to refuse for room

    def explained(self) -> str:
        what = {ADMIT: "admitted", QUEUE: "queued", WAIT: "waiting", REFUSE: f"refused ({self.status})"}[self.action]
        return (f"{what}: {self.reason} (budget {self.budget_s:.3f} s, engines' threshold {self.threshold_s:.3f} s, "
                f"estimated queue wait {self.wait_s:.3f} s)")


class Calibration:
    """How far observed TTFT runs from predicted, added to predictions: what the router's own work and
    the engines' step overheads add to the cost model. An EWMA of observed - predicted (each sample
    clamped to +-limit_s), decaying towards 0 with `halflife_s` when nothing is observed (a bias that
    refused everything would otherwise never meet the observation that corrects it), at most limit_s."""

    def __init__(self, limit_s: float, alpha: float = 0.05, halflife_s: float = 5.0) -> None:
        self.limit_s, self.alpha, self.halflife_s = limit_s, alpha, halflife_s
        self._bias, self._at = 0.0, 0.0

    def bias_s(self, now: float) -> float:
        return decayed(self._bias, self._at, now, self.halflife_s)

    def observe(self, predicted_s: float, observed_s: float, now: float) -> None:
        error = min(max(observed_s - predicted_s, -self.limit_s), self.limit_s)
        bias = self.bias_s(now)
        self._bias, self._at = bias + self.alpha * (error - bias), now

    def corrected(self, prediction: Prediction, now: float) -> Prediction:
        if prediction.ttft_s is None:
            return prediction
        return Prediction(ttft_s=max(prediction.prefill_s, prediction.ttft_s + self.bias_s(now)),
                          prefill_s=prediction.prefill_s)


class Prediction(msgspec.Struct, frozen=True, kw_only=True):
    ttft_s: float | None  # None: the policy predicts nothing (round_robin, least_load, ...): admit
    prefill_s: float = 0.0  # the request's own prefill, of ttft_s


NO_PREDICTION = Prediction(ttft_s=None)


def predicted_ttft(decision: Decision) -> Prediction:
    """The decision's predicted TTFT on its choice: the wait there plus its own prefill (kv_cost's
    first two terms)."""
    terms = decision.terms.get(decision.instance)
    return Prediction(ttft_s=terms[0] + terms[1], prefill_s=terms[1]) if terms else NO_PREDICTION


def threshold_of(config: AdmissionConfig, ask: Ask) -> float:
    """What the engines may hold of predicted TTFT: SLO x (1 + margin), never below the request's
    own prefill (which no wait can shorten)."""
    return max(ask.slo_s * (1.0 + config.margin), ask.prefill_s)


def on_arrival(config: AdmissionConfig, ask: Ask, queue: FairQueue, rates: Rates, weights: Mapping[str, float],
               now: float) -> Verdict:
    """Admit now, queue (perhaps displacing a queued entry) or refuse a new request. With a queue
    shared by the fleet (fleet_share.py), a request goes at once only in its turn there too."""
    threshold, budget = threshold_of(config, ask), ask.slo_s - (now - ask.arrived)
    ahead = queue.ahead(ask.tenant, ask.band, ask.weight)
    first = ahead == 0 and queue.in_turn(ask.tenant, ask.band, ask.weight)
    predicted = ask.predicted_s
    common = _Common(budget_s=budget, threshold_s=threshold)
    fair = FairNow(rates, weights, now)
    if held_back(config, ask, queue, rates, fair):
        return _refuse("over_share", True, 0.0, 0.0, common)
    if first and (predicted is None or predicted <= min(threshold, budget)):
        return Verdict(action=ADMIT, reason="fits", **common)
    if first and predicted is not None and predicted <= budget and fair().light(ask.tenant):
        return Verdict(action=ADMIT, reason="light", **common)
    if first and now - rates.last(ask.tenant) >= config.probe_s:
        return Verdict(action=ADMIT, reason="probe", **common)
    admitted = rates.rates(now)
    drain = max(sum(admitted.values()), config.min_drain_rps)
    excess = max(0.0, predicted - threshold) if predicted is not None else 0.0
    wait = max((ahead + 1) / drain if ahead else 0.0, excess)
    engine = threshold if predicted is not None else 0.0  # the engines' backlog when its turn comes
    over = fair().over_share(ask.tenant)
    if wait + engine > budget:
        return _refuse("over_share" if over else "saturated", over, wait + engine - budget, wait, common)
    displace = None
    if len(queue) >= config.max_queue:
        displace = queue.victim(ask.tenant, ask.band, weights)
        if displace is None:
            return _refuse("queue_full", over, (ahead + 1) / drain, wait, common)
    return Verdict(action=QUEUE, reason="queued_ahead" if ahead else "engines_busy", wait_s=wait,
                   displace=displace, **common)


def before_prediction(config: AdmissionConfig, ask: Ask, queue: FairQueue, rates: Rates,
                      weights: Mapping[str, float], now: float) -> Verdict | None:
    """A refusal decided before the request is tokenized and predicted (the cheap path of a flood):
    its tenant held back for another's share, or the queue ahead too long; None: go on to `on_arrival`."""
    threshold, budget = threshold_of(config, ask), ask.slo_s - (now - ask.arrived)
    common = _Common(budget_s=budget, threshold_s=threshold)
    fair = FairNow(rates, weights, now)
    if held_back(config, ask, queue, rates, fair):
        return _refuse("over_share", True, 0.0, 0.0, common)
    ahead = queue.ahead(ask.tenant, ask.band, ask.weight)
    if not ahead:
        return None
    wait = (ahead + 1) / max(sum(rates.rates(now).values()), config.min_drain_rps)
    if wait + threshold <= budget:
        return None
    over = fair().over_share(ask.tenant)
    return _refuse("over_share" if over else "saturated", over, wait + threshold - budget, wait, common)


CONTENDED = 0.25  # the engines past this share of the threshold in predicted wait: contended


class FairNow:
    """The fleet's fair shares for one decision at `now` (shares.py `Fair`), worked out at most once
    and only if the decision asks: an uncontended request never needs them."""

    __slots__ = ("rates", "weights", "now", "_fair")

    def __init__(self, rates: Rates, weights: Mapping[str, float], now: float) -> None:
        self.rates, self.weights, self.now = rates, weights, now
        self._fair: Fair | None = None

    def __call__(self) -> Fair:
        if self._fair is None:
            self._fair = Fair(self.weights, self.rates.shares(self.now), self.rates.demands(self.now))
        return self._fair


def held_back(config: AdmissionConfig, ask: Ask, queue: FairQueue, rates: Rates, fair: FairNow) -> bool:
    """The request's tenant is over its weighted fair share while another tenant under its own asked
    lately (shares.py `held_back`, `recent_s`), and the fleet is contended: requests wait in the
    queue, or the engines hold more than CONTENDED x the threshold of predicted wait (the request's
    own prefill aside; before a prediction, only the queue says so). Otherwise it goes on: refusing
    it would leave the engines idle, and what is admitted is what the shares are judged by."""
    if not len(queue):
        if ask.predicted_s is None or ask.predicted_s - ask.prefill_s <= CONTENDED * threshold_of(config, ask):
            return False
    return fair().held_back(ask.tenant, rates.arrived_since(fair.now - config.recent_s))


def arriving(config: AdmissionConfig, ask: Ask, queue: FairQueue, rates: Rates, weights: Mapping[str, float],
             now: float) -> Verdict | None:
    """A request arrives within its tenant's limits: its demand counted (shares.py), then
    `before_prediction`. The router's gate and the simulator both enter here."""
    rates.arrived(ask.tenant, now)
    return before_prediction(config, ask, queue, rates, weights, now)


def head_verdict(config: AdmissionConfig, ask: Ask, queue: FairQueue, rates: Rates, weights: Mapping[str, float],
                 now: float, *, last_admitted: float, in_turn: bool) -> Verdict:
    """`on_head` with its tenant's shares read here (held back; else light): the router's gate and the
    simulator both decide the head by this."""
    fair = FairNow(rates, weights, now)
    held = held_back(config, ask, queue, rates, fair)
    light = not held and fair().light(ask.tenant)
    return on_head(config, ask, now, last_admitted, in_turn=in_turn, held=held, light=light)


def on_head(config: AdmissionConfig, ask: Ask, now: float, last_admitted: float = -math.inf, *,
            in_turn: bool = True, held: bool = False, light: bool = False) -> Verdict:
    """The queue's head, woken by news from the fleet: admit, keep waiting, or refuse (its deadline;
    `held`: its tenant is held back for another's share now, `held_back`, as on arrival; `light`:
    it goes once its prediction fits its budget, in its turn or not, as on arrival).
    Not `in_turn` (the fleet's other queues hold entries well before it: fleet_share.py), it waits."""
    threshold, budget = threshold_of(config, ask), ask.slo_s - (now - ask.arrived)
    predicted = ask.predicted_s
    common = _Common(budget_s=budget, threshold_s=threshold)
    if held:
        return _refuse("over_share", True, 0.0, 0.0, common)
    if light and predicted is not None and predicted <= budget:
        return Verdict(action=ADMIT, reason="light", **common)
    if not in_turn:
        if predicted is not None and predicted > budget:
            return _refuse("deadline", False, predicted - budget, 0.0, common)
        return Verdict(action=WAIT, reason="fleet_turn", **common)
    if predicted is None or predicted <= min(threshold, budget):
        return Verdict(action=ADMIT, reason="fits", **common)
    if now - last_admitted >= config.probe_s:
        return Verdict(action=ADMIT, reason="probe", **common)
    if predicted > budget:
        return _refuse("deadline", False, predicted - budget, 0.0, common)
    return Verdict(action=WAIT, reason="engines_busy", **common)


EXPIRE_SHARE = 0.1  # a queued request is refused with at most this share of its SLO left, whatever the threshold


def expires_at(slo_s: float, arrived: float, threshold_s: float = 0.0) -> float:
    """When a queued request is refused without waiting to be the head: once its budget is below what
    the engines may hold (`threshold_s`, threshold_of), its wait plus the engines' backlog when its turn
    comes can no longer meet the SLO (on_arrival's rule, applied as time passes); at the latest with
    EXPIRE_SHARE of the SLO left."""
    return arrived + slo_s - max(threshold_s, slo_s * EXPIRE_SHARE)


def _refuse(reason: str, too_many: bool, late_s: float, wait: float, common: _Common) -> Verdict:
    return Verdict(action=REFUSE, reason=reason, status=429 if too_many else 503,
                   retry_after_s=max(1.0, math.ceil(late_s)), wait_s=wait, **common)
