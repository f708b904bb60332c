"""The test process's memory (a pytest plugin): reclaimed between tests, and its peak reported.

What a test leaves for the cyclic collector is collected after it (`reclaim`). To measure,
before each test the kernel's high-water mark of this process (VmHWM in /proc/self/status) is reset
to the current RSS (writing 5 to /proc/self/clear_refs), and read again after it: that test's peak.
The terminal summary names the run's peak and the test that reached it, then the tests that raised
the RSS most while they ran (`--rss-top N`, default 5), with what each left held when it ended;
`--rss-limit-mb M` fails the run when a test's peak passes M (default: none). Linux only; elsewhere
it reports nothing. Processes a test starts are not counted (each is its own).

    python3 -m pytest -q -p no:cacheprovider --rss-top 20
"""

from __future__ import annotations

import gc
import pathlib

import aiohttp.web_app
import pytest

STATUS, CLEAR_REFS = pathlib.Path("/proc/self/status"), pathlib.Path("/proc/self/clear_refs")
_peaks: dict[str, tuple[float, float, float]] = {}  # test id -> (RSS at its start, its peak, RSS at its end), MB


def _status_mb(field: str) -> float | None:
    try:
        for line in STATUS.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024  # kB
    except OSError:
        return None
    return None


def rss_mb() -> float | None:
    """This process's resident memory now, MB (None where /proc is not)."""
    return _status_mb("VmRSS")


def _reset_peak() -> bool:
    try:
        CLEAR_REFS.write_text("5")
        return True
    except OSError:
        return False


# aiohttp keeps each app's middleware chain per handler in a process-wide lru_cache (up to 1,024 entries):
# an app served once, and the engine it holds, outlive their test without this
_MIDDLEWARE_CACHE = getattr(aiohttp.web_app, "_cached_build_middleware", None)
RECLAIM_AFTER_MB = 64  # a test that grew the process by more than this leaves it to a full collection


def reclaim(before: float | None) -> None:
    """What the test that just ended (fixtures and all) left for the cyclic collector goes now, not
    whenever a full collection happens to run: an engine or router app started in-process is freed
    only by it (its app and components refer to each other), and a simulation run in-process freezes
    whatever is alive then, dead cycles included (`gc.freeze`, loadgen/sim/parallel.py), for good.
    Left alone, torch engines' KV pools piled up to a 7.8 GB test process."""
    if _MIDDLEWARE_CACHE is not None:
        _MIDDLEWARE_CACHE.cache_clear()  # its entries refer to the apps the test served
    frozen = gc.get_freeze_count()
    if frozen:
        gc.unfreeze()
    if frozen or (before is not None and (rss_mb() or 0.0) - before > RECLAIM_AFTER_MB):
        gc.collect()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("peak RSS")
    group.addoption("--rss-top", type=int, default=5, help="list the N tests that raised the RSS most")
    group.addoption("--rss-limit-mb", type=float, default=None, help="fail the run if a test's peak RSS passes this")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    start = rss_mb() if _reset_peak() else None
    yield
    peak = _status_mb("VmHWM")
    reclaim(start)
    end = rss_mb()
    if start is not None and peak is not None and end is not None:
        _peaks[item.nodeid] = (start, peak, end)


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    if not _peaks:
        return
    name, (_, top, _) = max(_peaks.items(), key=lambda kv: kv[1][1])
    terminalreporter.write_line(f"peak RSS of the test process: {top:,.0f} MB ({name})")
    grew = sorted(_peaks.items(), key=lambda kv: kv[1][1] - kv[1][0], reverse=True)
    for nodeid, (start, peak, end) in grew[: config.getoption("rss_top")]:
        terminalreporter.write_line(f"  {peak - start:+7,.0f} MB while it ran (peak {peak:,.0f} MB), "
                                    f"{end - start:+7,.0f} MB held after  {nodeid}")
    limit = config.getoption("rss_limit_mb")
    if limit is not None and top > limit:
        terminalreporter.write_line(f"peak RSS over --rss-limit-mb {limit:g}: the run fails", red=True)


def pytest_sessionfinish(session: pytest.Session, exitstatus) -> None:
    limit = session.config.getoption("rss_limit_mb")
    if limit is not None and any(peak > limit for _, peak, _ in _peaks.values()):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
