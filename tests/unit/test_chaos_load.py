"""loadgen/chaos/load.py: every background request is in its row from the moment it is spawned."""

import aiohttp

from kvroute.loadgen.chaos.load import LoadClient, Prompts, Tally


async def test_a_spawned_request_is_counted_before_its_task_runs():
    """A scenario ends by switching rows and draining the old one at once: a request spawned just
    before must already count as sent and in flight, or the drain returns and the row misses its end."""
    async with aiohttp.ClientSession() as session:
        load = LoadClient(session, ["http://127.0.0.1:9"], Prompts(seed=1), rate=1.0, timeout_s=2.0)
        tally = Tally("s")
        task = load.spawn(tally, stream=False)
        assert (tally.sent, tally.inflight) == (1, 1)  # nothing has run yet
        await task
        assert tally.inflight == 0 and tally.ok + tally.lost + tally.broken == tally.sent == 1
