"""Reading a server-sent-events answer into its data payloads."""

import orjson


async def sse_events(resp):
    events = []
    async for line in resp.content:
        line = line.strip()
        if line.startswith(b"data: "):
            payload = line[6:]
            events.append(payload if payload == b"[DONE]" else orjson.loads(payload))
    return events
