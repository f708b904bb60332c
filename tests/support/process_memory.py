"""The test process's memory (a pytest plugin): reclaimed after each test, and the run's peak reported.

What a test leaves for the cyclic collector is collected after it (`reclaim`). After each test the
kernel's high-water mark of this process (VmHWM in /proc/self/status) is read: the terminal summary
names the run's peak RSS, the test that reached it and the tests that raised it most (`--rss-top N`,
default 5), and the largest RSS of any process the tests started and waited for (RUSAGE_CHILDREN:
redis-server, engines, routers). `--rss-limit-mb M` fails the run when either passes M (default: none).
`--rss-each-test` resets the high-water mark before every test (writing 5 to /proc/self/clear_refs) to
rank the tests by their own peaks instead; the process's own figure that `/usr/bin/time -v` prints is
then the last test's alone. Linux only; elsewhere nothing is reported.

    python3 -m pytest -q -p no:cacheprovider --rss-top 20
"""

from __future__ import annotations

import dataclasses
import gc
import pathlib
import resource

import aiohttp.web_app
import pytest

STATUS, CLEAR_REFS = pathlib.Path("/proc/self/status"), pathlib.Path("/proc/self/clear_refs")
_tests: dict[str, tuple[float, float, float]] = {}  # test id -> (RSS at its start, its rise, RSS at its end), MB


@dataclasses.dataclass
class _Peak:
    mb: float = 0.0  # this process's peak so far
    test: str = ""  # the test that reached it


_high = _Peak()


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


def children_peak_mb() -> float:
    """The largest RSS any process started by this one (and waited for) reached, MB (Linux: kB)."""
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def _reset_peak() -> None:
    try:
        CLEAR_REFS.write_text("5")
    except OSError:
        pass


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
    group.addoption("--rss-top", type=int, default=5, help="list the N tests that raised the peak RSS most")
    group.addoption("--rss-limit-mb", type=float, default=None,
                    help="fail the run if the test process or one it started passes this peak RSS")
    group.addoption("--rss-each-test", action="store_true",
                    help="reset the peak before each test, to rank tests by their own peaks")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    each = item.config.getoption("rss_each_test")
    if each:
        _reset_peak()
    start = rss_mb()
    yield
    peak = _status_mb("VmHWM")
    reclaim(start)
    end = rss_mb()
    if start is None or peak is None or end is None:
        return
    _tests[item.nodeid] = (start, peak - (start if each else max(start, _high.mb)), end)
    if peak > _high.mb:
        _high.mb, _high.test = peak, item.nodeid


def _over_limit(config: pytest.Config) -> float | None:
    limit = config.getoption("rss_limit_mb")
    return limit if limit is not None and max(_high.mb, children_peak_mb()) > limit else None


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    if not _tests:
        return
    terminalreporter.write_line(f"peak RSS of the test process: {_high.mb:,.0f} MB ({_high.test}); "
                                f"of a process it started: {children_peak_mb():,.0f} MB")
    risen = sorted(((rise, end - start, nodeid) for nodeid, (start, rise, end) in _tests.items() if rise > 0),
                   reverse=True)
    if risen:
        above = "its start" if config.getoption("rss_each_test") else "the earlier peak"
        terminalreporter.write_line(f"the tests that raised it most: MB above {above}, MB held when it ended")
    for rise, held, nodeid in risen[: config.getoption("rss_top")]:
        terminalreporter.write_line(f"  {rise:+7,.0f} {held:+7,.0f}  {nodeid}")
    limit = _over_limit(config)
    if limit is not None:
        terminalreporter.write_line(f"peak RSS over --rss-limit-mb {limit:g}: the run fails", red=True)


def pytest_sessionfinish(session: pytest.Session, exitstatus) -> None:
    if _tests and _over_limit(session.config) is not None:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
