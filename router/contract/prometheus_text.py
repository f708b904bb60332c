"""Read a few samples out of a Prometheus text exposition, fast.

An engine's /metrics is tens of kilobytes (histograms); the router polls it every
`--load-interval-s` per engine, so instead of parsing every line it searches for the
names it wants (C-speed `str.find`) and sums their samples across label sets (one per
data-parallel engine or model).
"""

from __future__ import annotations

import re

_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def _samples(text: str, name: str):
    """(labels text, value) of every sample of `name`."""
    start = 0
    while True:
        i = text.find(name, start)
        if i < 0:
            return
        start = i + len(name)
        if (i and text[i - 1] != "\n") or start >= len(text) or text[start] not in "{ ":
            continue  # a longer name, or inside another line
        end = text.find("\n", start)
        line = text[start:] if end < 0 else text[start:end]
        labels, _, rest = line.rpartition("}") if line.startswith("{") else ("", "", line)
        try:
            yield labels, float(rest.split()[0])
        except (IndexError, ValueError):
            continue


def _first_present(text: str, names: tuple[str, ...], reduce) -> float | None:
    for name in names:
        values = [v for _, v in _samples(text, name)]
        if values:
            return reduce(values)
    return None


def metric_sum(text: str, *names: str) -> float | None:
    """The sum of the samples of the first of `names` present; None when none is."""
    return _first_present(text, names, sum)


def metric_max(text: str, *names: str) -> float | None:
    return _first_present(text, names, max)


def latest_labels(text: str, name: str) -> dict[str, str] | None:
    """The labels of the sample of `name` with the largest value (a gauge set to the time of each
    update, whose older label sets stay exported: vllm:lora_requests_info)."""
    best = max(_samples(text, name), key=lambda sample: sample[1], default=None)
    return dict(_LABEL.findall(best[0])) if best is not None else None


def metric_labels(text: str, name: str) -> dict[str, str] | None:
    """The labels of the first sample of `name` (info-style metrics such as vllm:cache_config_info)."""
    for labels, _ in _samples(text, name):
        return dict(_LABEL.findall(labels))
    return None
