"""`kvroute router --workers N`: N router processes on one port, for more than one core.

The parent binds N listening sockets to the same host:port with SO_REUSEPORT (the
first one picks the port when it is 0) and starts one worker process per socket: the
same command line, told by KVROUTE_LISTEN_FD which inherited socket to serve. The
kernel spreads new connections over the sockets by a hash of their addresses, so a
client's keep-alive connection stays with one worker. The parent holds the sockets,
restarts a worker that dies (its socket keeps its backlog meanwhile), and on SIGTERM or
SIGINT passes the signal on and waits for every worker to finish.

Each worker is a whole router: its own engines' health and load polls, its own KV
event feed into its own index (or the shared Redis index with --index redis), its own
metrics. What the workers do not share is the router-side load of the requests in
flight: each one counts only its own. To stay honest about the fleet, a worker that
knows it is one of N (--workers) charges an instance with at least the prefill
queue the engine itself last reported, not only with the prefill it sent there
(`Instance.peers`, router/fleet/instance.py), and the engines' `running + waiting` already
stand in for the others' requests in the decode term. Pending-block credits stay per
worker: a sibling routed by another worker is seen once its blocks' KV events arrive.
Dynamic membership goes through the registry (--registry), which every worker follows;
the admin API, which would change one worker only, refuses changes. GET /router/stats
says how many workers there are, so the planner scales one worker's demand by N.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time

from kvroute.router.contract.interrupt import INTERRUPTED

log = logging.getLogger(__name__)

LISTEN_FD = "KVROUTE_LISTEN_FD"
SUPERVISOR = "KVROUTE_SUPERVISOR_PID"
RESTART_PAUSE_S = 1.0
QUICK_S, MAX_QUICK_FAILURES = 10.0, 3  # exits within QUICK_S of a start, in a row, before giving up


def worker_socket() -> socket.socket | None:
    """The inherited listening socket when this process is one of --workers (None otherwise)."""
    fd = os.environ.get(LISTEN_FD)
    if fd is None:
        return None
    die_with_supervisor()
    return socket.socket(fileno=int(fd))


def die_with_supervisor() -> None:
    """In a worker: SIGTERM when the supervisor dies, even by SIGKILL (Linux prctl); exit now if it
    is gone already."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if str(os.getppid()) != os.environ.get(SUPERVISOR):
        raise SystemExit(0)


def bind_reuseport(host: str, port: int, n: int) -> list[socket.socket]:
    """`n` listening sockets on host:port, all SO_REUSEPORT; OSError says why not."""
    if not hasattr(socket, "SO_REUSEPORT"):
        raise OSError("--workers needs SO_REUSEPORT, which this platform lacks")
    family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket(family, kind, proto)
            socks.append(s)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            s.bind(addr)
            s.listen(1024)
            addr = s.getsockname()  # port 0: the others join the port the first one got
            s.set_inheritable(True)
    except OSError as e:
        for s in socks:
            s.close()
        raise OSError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    return socks


def supervise(argv: list[str], socks: list[socket.socket]) -> int:
    """Run one worker per socket until SIGTERM/SIGINT; restart workers that die."""
    stopping = False
    code_out = 0  # 1 when a worker cannot start, 130 when SIGINT stopped them (interrupt.py)
    procs: list[subprocess.Popen | None] = [None] * len(socks)

    def start(i: int) -> subprocess.Popen:
        env = dict(os.environ, **{LISTEN_FD: str(socks[i].fileno()), SUPERVISOR: str(os.getpid())})
        return subprocess.Popen([sys.executable, "-m", "kvroute.router", *argv], env=env, pass_fds=(socks[i].fileno(),))

    def stop(signum, _frame) -> None:
        nonlocal stopping, code_out
        stopping = True
        if signum == signal.SIGINT:
            code_out = INTERRUPTED
        for p in procs:
            if p is not None and p.poll() is None:
                p.send_signal(signum)

    def hangup(signum, _frame) -> None:  # reload the tenant file: every worker's
        for p in procs:
            if p is not None and p.poll() is None:
                p.send_signal(signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGHUP, hangup)
    host, port = socks[0].getsockname()[:2]
    started = [time.monotonic()] * len(socks)
    quick_failures = 0
    for i in range(len(socks)):
        procs[i] = start(i)
    print(f"kvroute router: {len(socks)} workers on http://{host}:{port}", file=sys.stderr, flush=True)
    while True:
        alive = False
        for i, p in enumerate(procs):
            assert p is not None  # every worker was started above
            code = p.poll()
            if code is None:
                alive = True
                continue
            if stopping:
                continue
            quick_failures = quick_failures + 1 if time.monotonic() - started[i] < QUICK_S else 0
            if quick_failures >= MAX_QUICK_FAILURES:  # it cannot start: stop rather than loop
                print(f"kvroute router: worker {i} keeps exiting ({code}) right after it starts; stopping",
                      file=sys.stderr, flush=True)
                stop(signal.SIGTERM, None)
                code_out = 1
                continue
            log.warning("router worker %d (pid %d) exited with %d; restarting it", i, p.pid, code)
            time.sleep(RESTART_PAUSE_S)
            procs[i], started[i] = start(i), time.monotonic()
            alive = True
        if stopping and not alive:
            break
        time.sleep(0.2)
    for s in socks:
        s.close()
    return code_out
