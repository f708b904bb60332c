"""KV events from engines we did not write: vLLM's (and SGLang's) ZeroMQ format.

Layers, kept apart as llm-d does (transport, parsing, adaptation):

    replay.py      DEALER client for the publisher's replay socket
    subscriber.py  one SUB socket per publisher: seq order, gaps -> replay, resets
    wire.py        frames and msgpack payloads -> typed events (both encodings)
    translate.py   events -> index operations on the router's own chained hashes
    follower.py    one feed per instance: subscribers + BlockMap -> the block index
    sources.py     `URL=ENDPOINT[,ENDPOINT...]` flags (vllm-router's spelling)
    metrics.py     kvroute_router_zmq_* counters and the publish->index lag
"""
