"""`kvroute chaos`: break a local fleet on purpose and prove nothing is lost.

On loopback, a real redis-server, sim engines and routers sharing the Redis index run
under steady background load while scenarios inject faults: a fuzz of malformed bodies,
an engine killed and restarted, an engine hung, Redis killed and frozen, 1,000 concurrent
streams, a router restarted. One table comes out (requests, losses before the first
byte, errors by status, 5xx, time to eject and to resync, RSS), and named invariants
decide the exit status.

    config.py        ChaosConfig (flags map 1:1)
    procs.py         one server process: kill -9, stop, continue, terminate, restart
    fleet.py         redis + engines + routers, readiness, their HTTP views
    load.py          background load with load-balancer failover, per-scenario tallies
    fuzz_fields.py   the fields kvroute reads and what the API allows in each
    fuzz_cases.py    malformed bodies by category; fuzz_kv.py: kv_transfer_params shapes
    httpraw.py       a raw HTTP/1.1 client (reads while writing 50 MB, chunked, short bodies)
    fuzz.py          send the cases, judge every answer
    watch.py         what scenarios wait for (ejected, caught up, breaker, index hits)
    scenarios/       one module per kind of fault, one registry
    rss.py           VmRSS/VmHWM before/peak/after
    invariants.py    row and log checks
    rows.py          the table
    runner.py, cli.py
"""
