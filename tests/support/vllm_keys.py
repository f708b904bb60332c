"""The parity fixtures vLLM's own code wrote (tests/unit/data/vllm_keys.json; kvroute/scripts/vllm_key_fixtures.py)."""

import json
import pathlib

from kvroute.router.contract.block_keys import ImageKey, RequestKeys
from kvroute.router.contract.image_keys import image_hash

FIXTURES = json.loads((pathlib.Path(__file__).parents[1] / "unit" / "data" / "vllm_keys.json").read_text())
CASES = {case["name"]: case for case in FIXTURES["cases"]}


def request_keys(case) -> RequestKeys:
    """The router's keys for a fixture's request (its images hashed by the router's own code)."""
    images = tuple(ImageKey(hash=image_hash(im["data_uri"], case["model_id"]), offset=im["offset"],
                            length=im["length"]) for im in case["images"])
    return RequestKeys(adapter=case["adapter"], salt=case["salt"], images=images)
