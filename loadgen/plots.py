"""PNG plots of one or more runs (matplotlib's Agg canvas, no pyplot state).

Each function takes a list of (name, records) and a path.
"""

from __future__ import annotations

import pathlib
from collections.abc import Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

from kvroute.loadgen.record import RequestRecord

Named = Sequence[tuple[str, Sequence[RequestRecord]]]


def _save(fig: Figure, path: pathlib.Path) -> None:
    FigureCanvasAgg(fig)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def _ttfts(records: Sequence[RequestRecord]) -> list[float]:
    return [r.ttft_s for r in records if r.ok and r.ttft_s is not None]


def ttft_cdf(runs: Named, path: pathlib.Path) -> None:
    """Log x axis: cache hits (tens of ms) and misses (hundreds) are both readable."""
    fig = Figure(figsize=(7, 4.5))
    ax = fig.add_subplot()
    for name, records in runs:
        values = np.sort(_ttfts(records)) * 1000
        if len(values):
            ax.step(values, np.arange(1, len(values) + 1) / len(values), where="post", label=name)
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(FixedLocator([1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000]))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("TTFT (ms, log scale)")
    ax.set_ylabel("fraction of requests")
    ax.set_title("TTFT CDF")
    ax.set_ylim(0, 1.01)
    ax.grid(alpha=0.3, which="both")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="lower right")
    _save(fig, path)


def ttft_over_time(runs: Named, path: pathlib.Path) -> None:
    """One panel per run, all on the same y scale so the panels compare at a glance."""
    fig = Figure(figsize=(8, 2.2 * max(1, len(runs)) + 0.8))
    axes = fig.subplots(max(1, len(runs)), 1, sharex=True, sharey=True, squeeze=False)[:, 0]
    for ax, (name, records) in zip(axes, runs):
        ok = [r for r in records if r.ok and r.ttft_s is not None]
        bad = [r for r in records if not r.ok]
        ax.scatter([r.send_s for r in ok], [r.ttft_s * 1000 for r in ok if r.ttft_s is not None], s=6, alpha=0.6)
        if bad:
            ax.scatter([r.send_s for r in bad], [0.0] * len(bad), s=12, marker="x", color="red")
        ax.set_title(name + (f" ({len(bad)} errors, red)" if bad else ""), fontsize=10)
        ax.set_ylabel("TTFT (ms)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("send time (s from start)")
    _save(fig, path)


UNEVEN_NOTE = ("Uneven bars are by design for cache-aware policies (prefix_hash, kv_aware): each shared-prefix "
               "group stays on the\ninstances that hold its KV blocks, so an instance's count follows the size of "
               "the groups it serves; an even split\n(round_robin) prefills every group's prefix on every instance.")


def requests_per_instance(runs: Named, path: pathlib.Path) -> None:
    counts: list[dict[str, int]] = [{} for _ in runs]
    for c, (_, records) in zip(counts, runs):
        for r in records:
            if r.ok:
                c[r.instance or "unknown"] = c.get(r.instance or "unknown", 0) + 1
    instances = sorted({k for c in counts for k in c})
    fig = Figure(figsize=(max(7.5, 1.2 * len(instances) * max(1, len(runs)) ** 0.5 + 2), 4.8))
    ax = fig.add_subplot()
    width = 0.8 / max(1, len(runs))
    x = np.arange(len(instances))
    for i, ((name, _), c) in enumerate(zip(runs, counts)):
        ax.bar(x + (i - (len(runs) - 1) / 2) * width, [c.get(k, 0) for k in instances], width, label=name)
    crowded = len(instances) > 4
    ax.set_xticks(x, instances, rotation=30 if crowded else 0, ha="right" if crowded else "center")
    ax.set_xlabel("engine instance (x-kvroute-instance)")
    ax.set_ylabel("completed requests")
    ax.set_title("requests per instance")
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    FigureCanvasAgg(fig)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.text(0.01, 0.01, UNEVEN_NOTE, fontsize=7.5, ha="left", va="bottom", color="0.3")
    fig.savefig(path, dpi=100)


PLOTS = {"ttft_cdf.png": ttft_cdf, "ttft_over_time.png": ttft_over_time,
         "requests_per_instance.png": requests_per_instance}
