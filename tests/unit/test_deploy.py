"""deploy/ checked offline: Kubernetes manifests against the API schemas (kubernetes-validate), the compose
file against the Compose spec (check-jsonschema's vendored copy), every container command against kvroute's
own CLI, and the Grafana dashboard against the metrics engines and routers export."""

import json
import pathlib
import re

import jsonschema
import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
DEPLOY = ROOT / "deploy"
K8S_VERSION = "1.30.0"


def docs(path: pathlib.Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def containers(doc: dict) -> list[dict]:
    spec = doc.get("spec", {}).get("template", {}).get("spec", {})
    return spec.get("containers", [])


MANIFESTS = ("kvroute.yaml", "gateway.yaml")
CRDS = DEPLOY / "k8s" / "crds"  # custom resources' schemas, vendored: nothing is fetched at test time


def k8s_docs() -> list[dict]:
    return [d for name in MANIFESTS for d in docs(DEPLOY / "k8s" / name)]


def custom_schemas() -> dict[tuple[str, str], dict]:
    """(apiVersion, kind) -> the openAPIV3Schema of each vendored CRD's served versions."""
    out = {}
    for path in CRDS.glob("*.yaml"):
        for crd in docs(path):
            spec = crd["spec"]
            for version in spec["versions"]:
                if version.get("served"):
                    key = (f"{spec['group']}/{version['name']}", spec["names"]["kind"])
                    out[key] = version["schema"]["openAPIV3Schema"]
    return out


@pytest.mark.parametrize("doc", k8s_docs(), ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_k8s_manifest_is_valid(doc):
    import kubernetes_validate

    custom = custom_schemas().get((doc["apiVersion"], doc["kind"]))
    if custom is not None:
        jsonschema.validate(doc, custom)  # the CRD's structural schema (its CEL rules: test_inference_pool)
    else:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    for c in containers(doc):
        assert c["imagePullPolicy"] == "IfNotPresent", c["name"]  # a locally built kvroute:latest is used as is
        assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"], c["name"]
        if c["image"].startswith("kvroute"):
            assert "startupProbe" in c and "livenessProbe" in c, c["name"]


def test_the_inference_pool_selects_the_engines_and_names_the_endpoint_pickers_service():
    """What the CRD's CEL rules and the API server would check, and what makes the pool work: its
    selector matches the engine pods and its target port is theirs; its endpoint picker is a Service
    with that port, in front of a kvroute router started with --ext-proc-port on it."""
    by_kind: dict[str, dict[str, dict]] = {}
    for d in k8s_docs():
        by_kind.setdefault(d["kind"], {})[d["metadata"]["name"]] = d
    (pool,) = by_kind["InferencePool"].values()
    engines = by_kind["StatefulSet"]["kvroute-engine"]["spec"]["template"]
    assert pool["spec"]["selector"]["matchLabels"].items() <= engines["metadata"]["labels"].items()
    engine_ports = {p["containerPort"] for c in engines["spec"]["containers"] for p in c["ports"]}
    ports = [p["number"] for p in pool["spec"]["targetPorts"]]
    assert len(set(ports)) == len(ports) and set(ports) <= engine_ports
    ref = pool["spec"]["endpointPickerRef"]
    assert ref.get("kind", "Service") == "Service" and "port" in ref  # the CRD's rule
    service = by_kind["Service"][ref["name"]]
    grpc = next(p for p in service["spec"]["ports"] if p["port"] == ref["port"]["number"])
    assert grpc["appProtocol"] == "kubernetes.io/h2c"
    picker = next(d for d in by_kind["Deployment"].values()
                  if service["spec"]["selector"].items() <= d["spec"]["template"]["metadata"]["labels"].items())
    (container,) = containers(picker)
    args = container["args"]
    assert args[0] == "router" and args[args.index("--ext-proc-port") + 1] == str(grpc.get("targetPort", grpc["port"]))
    assert container["readinessProbe"]["grpc"] == {"port": grpc["port"], "service": "readiness"}


def test_servicemonitors_point_at_named_service_ports():
    services = {d["metadata"]["name"]: d for d in docs(DEPLOY / "k8s" / "kvroute.yaml") if d["kind"] == "Service"}
    for monitor in docs(DEPLOY / "k8s" / "monitoring.yaml"):
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1" and monitor["kind"] == "ServiceMonitor"
        wanted = monitor["spec"]["selector"]["matchLabels"]
        matched = [s for s in services.values() if wanted.items() <= s["metadata"].get("labels", {}).items()]
        assert len(matched) == 1, monitor["metadata"]["name"]
        ports = {p.get("name") for p in matched[0]["spec"]["ports"]}
        assert all(e["port"] in ports for e in monitor["spec"]["endpoints"])


def test_compose_file_matches_the_compose_spec():
    import check_jsonschema

    schema_file = pathlib.Path(check_jsonschema.__file__).parent / "builtin_schemas" / "vendor" / "compose-spec.json"
    schema = json.loads(schema_file.read_text())
    jsonschema.validate(yaml.safe_load((DEPLOY / "compose.yaml").read_text()), schema)


def kvroute_commands() -> list[list[str]]:
    out = [s["command"] for s in yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"].values()
           if s.get("image", "").startswith("kvroute")]
    for doc in k8s_docs():
        out += [[a.replace("$(POD_NAME)", "pod-0") for a in c["args"]] for c in containers(doc)
                if c["image"].startswith("kvroute")]
    return out


@pytest.mark.parametrize("argv", kvroute_commands(), ids=lambda a: " ".join(a[:2]))
def test_every_container_command_parses(argv):
    from kvroute.engine.config import EngineConfig
    from kvroute.engine.service.cli import COMMAND as ENGINE
    from kvroute.router.contract.settings_values import build, pick
    from kvroute.router.service.cli import COMMAND as ROUTER
    from kvroute.router.service.config import RouterConfig

    command, config = {"engine": (ENGINE, EngineConfig), "router": (ROUTER, RouterConfig)}[argv[0]]
    args = command.parser(environ={}).parse_args(argv[1:])
    build(config, **pick(config, vars(args)))  # validates like the CLI does


def exported_names() -> set[str]:
    from prometheus_client import CollectorRegistry

    from kvroute.engine.service.metrics import EngineMetrics
    from kvroute.router.index.instrumented import InstrumentedIndex
    from kvroute.router.index.memory import MemoryIndex
    from kvroute.router.service.metrics import RouterMetrics
    from kvroute.router.service.routing_loss import RoutingLoss
    from kvroute.router.service.silent_miss_alarms import SilentMissAlarms

    names = set()
    router = RouterMetrics()
    InstrumentedIndex(MemoryIndex(), router.registry)
    RoutingLoss(router.registry)
    SilentMissAlarms(list, int, router.registry)
    for registry in (EngineMetrics("m", CollectorRegistry()).registry, router.registry):
        for family in registry.collect():
            suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}.get(family.type, ("",))
            names |= {family.name + s for s in suffixes}
    return names


def test_dashboard_is_generated_and_names_real_metrics():
    from kvroute.scripts import grafana_dashboard

    path = DEPLOY / "grafana" / "kvroute-dashboard.json"
    assert path.read_text() == grafana_dashboard.render(), "run python -m kvroute.scripts.grafana_dashboard"
    dashboard = json.loads(path.read_text())
    exported = exported_names()
    titles = " ".join(p["title"] for p in dashboard["panels"]).lower()
    for topic in ("ttft", "tpot", "predicted vs actual", "by instance", "routing decisions", "ejections"):
        assert topic in titles
    for p in dashboard["panels"]:
        for target in p["targets"]:
            used = set(re.findall(r"\b(?:vllm:|kvroute_)[a-z0-9_:]+", target["expr"]))
            assert used and used <= exported, (p["title"], used - exported)


def test_prometheus_scrapes_the_compose_services():
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    for job in config["scrape_configs"]:
        for static in job["static_configs"]:
            for target in static["targets"]:
                host, port = target.split(":")
                assert host in compose and f"--port', '{port}" in str(compose[host]["command"]).replace('"', "'")
    assert next(j for j in config["scrape_configs"] if j["job_name"] == "kvroute-router")["honor_labels"] is True


def test_dockerignore_keeps_what_the_dockerfile_copies():
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    copied = re.findall(r"^COPY (.+) \S+$", (DEPLOY / "Dockerfile").read_text(), re.M)
    for sources in copied:
        for src in sources.split():
            assert src not in ignored and (ROOT / src).exists(), src
    assert {".git", "tests"} <= ignored
