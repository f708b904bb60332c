"""The process harness (loadgen/processes.py) every command, benchmark and test that starts servers uses:
a server that dies is reported at once with its logs, a group stops what it started and keeps its logs only
when something went wrong, and a process that ignores SIGTERM is killed after the grace period."""

import os
import sys
import time

import pytest

from kvroute.loadgen.processes import Processes, free_port, spawn, stop_process, wait_ready

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


async def test_waiting_on_a_server_that_exited_fails_at_once_naming_the_logs():
    with pytest.raises(RuntimeError) as caught, Processes() as procs:
        procs.start("dies", [sys.executable, "-c", "import sys; print('bad flag'); sys.exit(3)"])
        t0 = time.monotonic()
        try:
            await procs.wait_ready(f"http://127.0.0.1:{free_port()}", timeout_s=60.0)
        finally:
            waited = time.monotonic() - t0
    assert "exit 3" in str(caught.value) and procs.log_dir in str(caught.value) and waited < 10
    assert open(procs.log_path("dies")).read().strip() == "bad flag"  # kept: the run failed


async def test_a_server_that_never_answers_times_out():
    proc = spawn(SLEEPER)
    try:
        with pytest.raises(RuntimeError, match=r"did not answer within 1 s"):
            await wait_ready(f"http://127.0.0.1:{free_port()}", timeout_s=1.0, watch=[proc])
    finally:
        stop_process(proc)


def test_a_group_stops_what_it_started_and_removes_its_logs_when_all_went_well():
    with Processes() as procs:
        started = [procs.start(f"p{i}", SLEEPER) for i in range(2)]
        log_dir = procs.log_dir
        assert os.path.isdir(log_dir) and all(p.poll() is None for p in started)
    assert all(p.returncode is not None for p in started) and not os.path.exists(log_dir)


def test_a_process_that_ignores_sigterm_is_killed_after_the_grace(tmp_path):
    log = tmp_path / "stubborn.log"
    proc = spawn([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                  "print('ready', flush=True); time.sleep(60)"], str(log))
    deadline = time.monotonic() + 30
    while "ready" not in log.read_text() and time.monotonic() < deadline:  # its handler is in place
        time.sleep(0.05)
    t0 = time.monotonic()
    assert stop_process(proc, grace_s=0.5) == -9 and time.monotonic() - t0 < 5
