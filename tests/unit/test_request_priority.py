"""A tenant's requests are no more urgent than the tenant file grants, in admission and in the body."""

import orjson
import pytest
from prometheus_client import CollectorRegistry

from kvroute.router.decision.admission import AdmissionConfig
from kvroute.router.decision.tenants import TenantSpec
from kvroute.router.service.admission_gate import AdmissionGate
from kvroute.router.service.admission_metrics import AdmissionMetrics
from kvroute.router.service.request_class import within_priority
from kvroute.router.service.tenant_book import TenantBook, parse_tenants


def test_a_priority_is_lowered_to_the_tenants_grant():
    assert TenantSpec(name="B").priority_for(-1000) == 0
    assert TenantSpec(name="B").priority_for(3) == 3
    assert TenantSpec(name="U", min_priority=-2).priority_for(-5) == -2
    assert TenantSpec(name="U", min_priority=-2).share(4).min_priority == -2


def test_the_forwarded_body_carries_the_lowered_priority():
    body = {"prompt": "x", "priority": -7}
    clean, raw = within_priority(body, orjson.dumps(body), 0)
    assert clean["priority"] == 0 and orjson.loads(raw) == {"prompt": "x", "priority": 0}
    raw = b'{"prompt": "x", "priority": 2}'
    assert within_priority(orjson.loads(raw), raw, 0)[1] is raw  # unchanged: the original bytes
    raw = b'{"prompt": "x"}'
    assert within_priority(orjson.loads(raw), raw, 0)[1] is raw


def test_the_tenant_file_grants_urgency_and_checks_it():
    specs = parse_tenants('[tenants.U]\nmin_priority = -3\n', ".toml")
    assert specs["U"].min_priority == -3
    with pytest.raises(ValueError, match="min_priority"):
        parse_tenants('{"tenants": {"U": {"min_priority": "high"}}}', ".json")


def test_the_gate_bands_by_the_granted_priority():
    book = TenantBook(None)
    book.tenants = {"U": TenantSpec(name="U", min_priority=-1)}
    gate = AdmissionGate(AdmissionConfig(), book, AdmissionMetrics(CollectorRegistry()), clock=lambda: 0.0)
    assert gate.ticket("B", -1000, None).band == 1
    assert gate.ticket("U", -1000, None).band == 0
