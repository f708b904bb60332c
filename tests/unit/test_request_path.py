"""The request path in stages (router/service/request_path.py): traced through a live router, a chat
completion's calls never go from the upstream HTTP client back into another router module (the
decision is recorded by the decide stage, before the send), and the figures the trace gives stay
within what docs/architecture.md#the-request-path states."""

import argparse

import pytest

from kvroute.benchmarks.trace_hops import run


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_the_http_client_calls_nothing_of_routing(stream):
    result = await run(argparse.Namespace(stream=stream))
    assert result["hops"] > 0 and result["modules"] > 10  # the trace saw the request
    from_upstream = [edge for edge in result["edges"] if edge.startswith("router.service.upstream ->")]
    assert from_upstream == []
    assert not [path for path in result["bounce_edges"] if "router.service.upstream" in path]
