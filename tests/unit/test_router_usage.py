"""Reading the engines' usage off relayed bytes, and the router metrics built on it."""

import orjson
from prometheus_client import generate_latest

from kvroute.router.service.metrics import RouterMetrics
from kvroute.router.service.usage import MAX_LINE_BYTES, StreamUsage, Usage, usage_from_body

USAGE = {"prompt_tokens": 40, "completion_tokens": 5, "total_tokens": 45,
         "prompt_tokens_details": {"cached_tokens": 32}}


def sse(*objs) -> bytes:
    return b"".join(b"data: " + orjson.dumps(o) + b"\n\n" for o in objs) + b"data: [DONE]\n\n"


def test_usage_from_a_whole_body():
    body = orjson.dumps({"id": "x", "choices": [{"text": "hi"}], "usage": USAGE})
    assert usage_from_body(body) == Usage(40, 5, 32)
    assert usage_from_body(orjson.dumps({"choices": []})) is None
    assert usage_from_body(b'{"usage": {"prompt_tokens": "many"}}') is None
    assert usage_from_body(b"not json, but \"usage\": {") is None
    no_details = dict(USAGE, prompt_tokens_details=None)
    assert usage_from_body(orjson.dumps({"usage": no_details})) == Usage(40, 5, None)



def test_usage_from_a_whole_body_is_the_top_level_usage_wherever_the_key_sits():
    other = {"prompt_tokens": 1, "completion_tokens": 1}

    def whole(raw: bytes):  # the reference: the body parsed whole
        data = orjson.loads(raw)
        return Usage.from_dict(data.get("usage")) if isinstance(data, dict) else None

    bodies = [
        orjson.dumps({"id": "x", "choices": [{"text": 'say "usage": {}'}], "usage": USAGE}),  # last: kvroute, SGLang
        orjson.dumps({"id": "x", "usage": USAGE, "kv_transfer_params": None}),  # fields after it: vLLM
        orjson.dumps({"usage": USAGE, "meta": {"usage": other}}),  # a nested usage last
        orjson.dumps({"meta": {"usage": other}, "usage": USAGE}) + b"\n",
        orjson.dumps({"choices": [{"text": "x"}], "usage": None}),
        orjson.dumps([{"usage": USAGE}]),  # not an object
    ]
    for raw in bodies:
        assert usage_from_body(raw) == whole(raw), raw
    assert [usage_from_body(raw) for raw in bodies[:4]] == [Usage(40, 5, 32)] * 4

def test_stream_usage_in_any_chunking():
    raw = sse({"choices": [{"text": "a"}], "usage": None}, {"choices": [{"text": "b"}], "usage": None},
              {"choices": [], "usage": USAGE})
    for size in (1, 7, 64, len(raw)):
        scanner = StreamUsage()
        for i in range(0, len(raw), size):
            scanner.feed(raw[i:i + size])
        assert scanner.usage == Usage(40, 5, 32), size


def test_stream_without_usage_and_spaced_json():
    scanner = StreamUsage()
    scanner.feed(sse({"choices": [{"text": "a"}]}))
    assert scanner.usage is None
    scanner.feed(b'data: {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}\n\n')
    assert scanner.usage == Usage(3, 2, None)


def test_an_over_long_line_is_skipped_not_buffered():
    scanner = StreamUsage()
    scanner.feed(b"data: " + b"x" * (MAX_LINE_BYTES + 10))
    assert len(scanner._partial) == 0
    scanner.feed(b"x" * 100 + b"\n\n" + sse({"choices": [], "usage": USAGE}))
    assert scanner.usage == Usage(40, 5, 32) and len(scanner._partial) == 0


def sample(metrics: RouterMetrics, line_start: str) -> float:
    text = generate_latest(metrics.registry).decode()
    assert "_created" not in text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(line_start))


def test_router_metrics_from_usage():
    m = RouterMetrics()
    m.observe_first_token("tiny", "e0", 0.02)
    m.observe_finished("tiny", "e0", 0.5, Usage(40, 5, 32), first_token_s=10.0, end_s=10.4)
    m.observe_finished("tiny", "e1", 0.1, None)
    m.observe_rejected(429)
    labels = '{instance="e0",model="tiny"}'
    assert sample(m, "kvroute_router_output_tokens_total" + labels) == 5
    assert sample(m, "kvroute_router_cached_tokens_total" + labels) == 32
    assert sample(m, "kvroute_router_usage_prompt_tokens_total" + labels) == 40
    assert abs(sample(m, "kvroute_router_time_per_output_token_seconds_sum" + labels) - 0.1) < 1e-9  # 0.4 s / 4
    assert sample(m, "kvroute_router_request_duration_seconds_count") == 2
    assert sample(m, "kvroute_router_time_to_first_token_seconds_count" + labels) == 1
    assert sample(m, 'kvroute_router_rejected_requests_total{status="429"}') == 1


def test_a_whole_answer_is_read_for_usage_when_the_request_ends_not_before():
    from kvroute.router.service.request_trace import RequestTrace

    trace = RequestTrace(model="m", stream=False, prompt_tokens=40)
    trace.body(orjson.dumps({"choices": [{"text": "hi"}], "usage": USAGE}), "e1")
    assert trace.usage is None and trace.instance == "e1" and trace.last_byte is not None  # not parsed on the way
    trace.end("200")
    assert trace.usage == Usage(40, 5, 32) and trace.whole is None and trace.output_tokens == 5
