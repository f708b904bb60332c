"""Write deploy/grafana/kvroute-dashboard.json: router and engine panels for one kvroute fleet.

    python -m kvroute.scripts.grafana_dashboard [OUT]

Labels it relies on (deploy/prometheus/prometheus.yml and deploy/k8s/monitoring.yaml set them):
engine series have `instance` = the engine's --instance-id; router series keep their own
`instance` (the engine a request went to, honor_labels) and `router` names the replica.
tests/unit/test_deploy.py checks every metric named here exists and the file is up to date.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

from kvroute.benchmarks.checkout import root

OUT = "deploy/grafana/kvroute-dashboard.json"  # in the checkout
RATE = "[$__rate_interval]"
SEL = '{model=~"$model"}'


def q(expr: str, legend: str) -> dict:
    return {"expr": expr, "legendFormat": legend, "datasource": {"type": "prometheus", "uid": "${datasource}"}}


def quantiles(metric: str, by: str = "", sel: str = "", qs=(0.5, 0.9, 0.99)) -> list[dict]:
    group = f"le{', ' + by if by else ''}"
    suffix = f" {{{{{by}}}}}" if by else ""
    return [q(f"histogram_quantile({p}, sum by ({group}) (rate({metric}_bucket{sel}{RATE})))",
              f"p{int(p * 100)}{suffix}") for p in qs]


def ratio(num: str, den: str, by: str = "") -> str:
    group = f" by ({by})" if by else ""
    return f"sum{group} (rate({num}{RATE})) / sum{group} (rate({den}{RATE}))"


PANELS = [  # (title, unit, targets, description)
    ("Router TTFT (streamed)", "s", quantiles("kvroute_router_time_to_first_token_seconds", sel=SEL),
     "Forwarded to the first byte from the engine, as the router saw it."),
    ("Engine TTFT p90 by instance", "s",
     quantiles("vllm:time_to_first_token_seconds", "instance", qs=(0.9,)), "Arrival at the engine to the first token."),
    ("Router TPOT per request", "s", quantiles("kvroute_router_time_per_output_token_seconds", sel=SEL),
     "(last byte - first byte) / (completion tokens - 1), from the engines' usage."),
    ("Engine time per output token (mean) by instance", "s",
     [q(ratio("vllm:time_per_output_token_seconds_sum", "vllm:time_per_output_token_seconds_count", "instance"),
        "{{instance}}")], "Mean gap between two tokens of a request (vLLM's buckets start at 10 ms)."),
    ("Cache hit rate: predicted vs actual", "percentunit", [
        q(ratio("kvroute_router_predicted_cached_tokens_total", "kvroute_router_prompt_tokens_total"),
          "router predicted"),
        q(ratio("kvroute_router_cached_tokens_total", "kvroute_router_usage_prompt_tokens_total"),
          "engines reported (via router)"),
        q(ratio("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"), "engine prefix cache"),
    ], "Share of prompt tokens cached: the router's prediction against what the engines reported."),
    ("Routing loss: prompt tokens not served from cache, by cause", "percentunit", [
        q(ratio(f'kvroute_router_routing_loss_tokens_total{{cause="{cause}"}}',
                'kvroute_router_routing_tokens_total{part="prompt"}'), legend)
        for cause, legend in (("workload", "workload (cached nowhere)"),
                              ("balancing", "balancing (better-cached instance passed over)"),
                              ("index_unserved", "index: predicted, not served"),
                              ("index_unpredicted", "index: served, not predicted"))
    ] + [q(ratio('kvroute_router_routing_tokens_total{part="served"}',
                 'kvroute_router_routing_tokens_total{part="prompt"}'), "served from cache")],
     "Of routed prompt tokens: served from cache, and lost because no instance held them, because routing "
     "passed over a better-cached instance for load, or because the index and the engine disagreed "
     "(docs/router.md#routing-loss)."),
    ("Actual cache hit rate by instance", "percentunit",
     [q(ratio("kvroute_router_cached_tokens_total", "kvroute_router_usage_prompt_tokens_total", "instance"),
        "{{instance}}")], "usage.prompt_tokens_details.cached_tokens over prompt tokens, per engine."),
    ("Requests running / waiting by instance", "short", [
        q("sum by (instance) (vllm:num_requests_running)", "running {{instance}}"),
        q("sum by (instance) (vllm:num_requests_waiting)", "waiting {{instance}}"),
    ], "The engines' own queues."),
    ("KV cache usage by instance", "percentunit", [q("sum by (instance) (vllm:kv_cache_usage_perc)", "{{instance}}")],
     "Fraction of KV blocks in use."),
    ("Router in-flight by instance", "short", [q("sum by (instance) (kvroute_router_inflight)", "{{instance}}")],
     "Requests the routers have in flight on each engine."),
    ("Routing decisions by instance", "reqps",
     [q(f"sum by (instance) (rate(kvroute_router_requests_total{RATE}))", "{{instance}}")],
     "Where the routers sent requests."),
    ("Requests by outcome", "reqps", [
        q(f"sum by (status) (rate(kvroute_router_requests_total{RATE}))", "{{status}}"),
        q(f"sum by (status) (rate(kvroute_router_rejected_requests_total{RATE}))", "rejected {{status}}"),
        q(f"sum (rate(kvroute_router_retries_total{RATE}))", "retries"),
    ], "Outcome per routed request (cancelled: the client left), rejections the router answered itself."),
    ("Decision time", "s", quantiles("kvroute_router_decision_seconds", qs=(0.5, 0.99)),
     "Tokenize + hash + index lookup + score."),
    ("Ejections and routable engines", "short", [
        q("sum (increase(kvroute_router_ejections_total[5m]))", "ejections (5 min)"),
        q("min by (instance) (kvroute_router_instance_routable)", "routable {{instance}}"),
        q("max by (instance) (kvroute_router_instance_mismatch)", "mismatch {{instance}}"),
        q("max by (instance, cause) (kvroute_router_silent_miss)", "silent miss {{instance}} ({{cause}})"),
    ], "Health-check ejections; 1 = the instance takes requests; mismatch: it advertises keys the router "
       "cannot reproduce; silent miss: its engine and the index disagree (docs/router.md#silent-miss-alarms)."),
    ("Tokens per second", "short", [
        q(f"sum by (instance) (rate(kvroute_router_output_tokens_total{RATE}))", "output {{instance}}"),
        q(f"sum (rate(vllm:prompt_tokens_total{RATE}))", "prompt (engines)"),
    ], "Completion tokens the engines reported, by instance."),
    ("Engine request phases (mean)", "s", [
        q(ratio(f"vllm:request_{phase}_time_seconds_sum", f"vllm:request_{phase}_time_seconds_count"), phase)
        for phase in ("queue", "prefill", "decode")
    ], "vLLM's phases: queue (waiting), prefill (to the first token), decode (first to last token)."),
    ("Request duration (router)", "s", quantiles("kvroute_router_request_duration_seconds", sel=SEL),
     "Arrival at the router to the last byte relayed."),
]


def panel(i: int, title: str, unit: str, targets: list[dict], description: str) -> dict:
    return {
        "id": i + 1, "type": "timeseries", "title": title, "description": description,
        "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}},
        "targets": [{**t, "refId": chr(ord("A") + k)} for k, t in enumerate(targets)],
    }


def dashboard() -> dict:
    return {
        "uid": "kvroute", "title": "kvroute: router and engines", "schemaVersion": 39, "version": 1,
        "editable": True, "time": {"from": "now-30m", "to": "now"}, "refresh": "10s", "tags": ["kvroute", "vllm"],
        "templating": {"list": [
            {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"},
            {"name": "model", "type": "query", "label": "model", "includeAll": True, "multi": True,
             "allValue": ".*", "current": {"text": "All", "value": "$__all"},
             "datasource": {"type": "prometheus", "uid": "${datasource}"},
             "query": {"query": "label_values(kvroute_router_request_duration_seconds_count, model)",
                       "refId": "model"}, "refresh": 2},
        ]},
        "panels": [panel(i, *p) for i, p in enumerate(PANELS)],
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", type=pathlib.Path, help=f"where to write it (default: {OUT})")
    out = parser.parse_args(argv).out or root() / OUT
    out.write_text(render())
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
