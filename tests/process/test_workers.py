"""`kvroute router --workers N`: N processes on one port, each serving, restarted when they
die, all stopped by one SIGTERM; membership changes through the admin API are refused."""

import asyncio
import os
import signal
import subprocess
import sys

import aiohttp

from kvroute.loadgen.processes import free_port, kvroute_argv, spawn, stop_process, wait_ready


async def pids_seen(url: str, connections: int) -> tuple[set[int], int]:
    pids, workers = set(), 0
    for _ in range(connections):  # a fresh connection each time: the kernel spreads them over the workers
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
            async with s.get(url + "/router/stats", headers={"Authorization": "Bearer k"}) as r:
                body = await r.json()
                pids.add(body["worker_pid"])
                workers = body["workers"]
    return pids, workers


def router(port: int, engine: str, log: str):
    return spawn(kvroute_argv("router", "--host", "127.0.0.1", "--port", str(port), "--engine", engine, "--workers",
                              "2", "--admin-key", "k", "--log-level", "WARNING"), log)


async def test_workers_share_one_port_restart_and_stop_together(start_engine, tmp_path):
    engine, _ = await start_engine(time_scale=0.01)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = router(port, engine, str(tmp_path / "router.log"))
    try:
        await wait_ready(url, watch=[proc], logs=str(tmp_path))
        pids, workers = await pids_seen(url, 40)
        assert workers == 2 and len(pids) == 2 and os.getpid() not in pids
        async with aiohttp.ClientSession() as s:
            async with s.post(url + "/v1/completions", json={"prompt": "hello", "max_tokens": 4}) as r:
                assert r.status == 200
            async with s.post(url + "/router/engines", json={"url": engine},
                              headers={"Authorization": "Bearer k"}) as r:
                assert r.status == 409 and (await r.json())["error"]["code"] == "workers_disagree"
        victim = min(pids)
        os.kill(victim, signal.SIGKILL)
        for _ in range(100):  # the supervisor starts a new worker on the dead one's socket
            await asyncio.sleep(0.2)
            try:
                now, _ = await pids_seen(url, 20)
            except aiohttp.ClientError:
                continue
            if len(now) == 2 and victim not in now:
                break
        assert len(now) == 2 and victim not in now, now
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        for pid in now:  # every worker is gone with it
            assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"
    finally:
        stop_process(proc)


def test_workers_out_of_range_is_a_one_line_error():
    out = subprocess.run([sys.executable, "-m", "kvroute.router", "--engine", "http://127.0.0.1:1", "--workers", "0"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--workers must be between 1 and 64" in out.stderr
    assert "Traceback" not in out.stderr


async def test_workers_die_with_a_killed_supervisor(start_engine, tmp_path):
    engine, _ = await start_engine(time_scale=0.01)
    port = free_port()
    proc = router(port, engine, str(tmp_path / "router.log"))
    try:
        await wait_ready(f"http://127.0.0.1:{port}", watch=[proc], logs=str(tmp_path))
        pids, _ = await pids_seen(f"http://127.0.0.1:{port}", 30)
    finally:
        proc.kill()  # the supervisor alone, not its process group: its workers must notice by themselves
        proc.wait()
        stop_process(proc)
    for _ in range(100):
        if not any(os.path.exists(f"/proc/{pid}") for pid in pids):
            break
        await asyncio.sleep(0.1)
    assert not any(os.path.exists(f"/proc/{pid}") for pid in pids)
