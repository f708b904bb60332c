"""vLLM's own `ZmqEventPublisher` (the vLLM package's vllm/distributed/kv_events.py) behind the same
small interface as tests/support/vllm_publisher.py, for the tests that run where vLLM imports:

    # in the venv of kvroute/scripts/vllm_key_fixtures.py:
    /tmp/vllm-venv/bin/python -m pytest tests/process/test_request_keys.py

Its sockets bind on ipc:// paths under a private directory (vLLM binds an endpoint with "*", "::"
or ipc://, and a wildcard TCP bind would leave loopback)."""

from __future__ import annotations

import pathlib
import tempfile
import time


class VllmPackagePublisher:
    def __init__(self) -> None:
        from vllm.distributed.kv_events import ZmqEventPublisher

        self._dir = tempfile.TemporaryDirectory(prefix="kvroute-vllm-")
        root = pathlib.Path(self._dir.name)
        self.endpoint, self.replay_endpoint = f"ipc://{root / 'pub'}", f"ipc://{root / 'replay'}"
        self._pub = ZmqEventPublisher(0, endpoint=self.endpoint, replay_endpoint=self.replay_endpoint)

    def publish_stored(self, hashes, parent, token_ids, *, lora_id=None, lora_name=None, extra_keys=None) -> None:
        from vllm.distributed.kv_events import BlockStored, KVEventBatch

        event = BlockStored(block_hashes=list(hashes), parent_block_hash=parent, token_ids=list(token_ids),
                            block_size=16, lora_id=lora_id, medium="GPU", lora_name=lora_name,
                            extra_keys=[tuple(e) if e else None for e in extra_keys] if extra_keys else None)
        self._pub.publish(KVEventBatch(ts=time.time(), events=[event]))

    def close(self) -> None:
        self._pub.shutdown()
        self._dir.cleanup()
