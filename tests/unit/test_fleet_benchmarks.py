"""The figures of kvroute/benchmarks/fleet_admission.py and routing_loss_gap.py, from records and summaries."""

import json

import pytest

from kvroute.benchmarks import fleet_admission, routing_loss_gap


def test_fleet_admission_tallies_every_replicas_records_and_calls_nothing_refused_lost(tmp_path):
    records = {"r0": [("A", 200, "", 0.2, 0.5), ("A", 429, "over_share", None, 4.0), ("B", 200, "", 0.9, 3.5)],
               "r1": [("A", 503, "saturated", None, 4.5), ("B", 0, "connection reset", None, 1.0)]}
    for replica, rows in records.items():
        (tmp_path / replica).mkdir()
        (tmp_path / replica / "requests.jsonl").write_text("".join(
            json.dumps({"group": f"{t}:random", "status": s, "error": e, "ttft_s": ttft, "send_s": at}) + "\n"
            for t, s, e, ttft, at in rows))
    got = fleet_admission.tally(tmp_path, duration=2.0)
    assert {k: got["A"][k] for k in ("sent", "admitted", "refused", "lost", "in_slo")} == \
        {"sent": 3, "admitted": 1, "refused": 2, "lost": 0, "in_slo": 1}
    assert got["B"]["lost"] == 1 and got["B"]["in_slo"] == 0 and got["B"]["admitted"] == 2  # late or lost: not in SLO
    assert got["A"]["admitted_per_s"] == 0.5
    assert got["A"]["admitted_steady"] == 0 and got["B"]["admitted_steady"] == 1  # sent from WARMUP_S on
    lines = fleet_admission.table({"one": {"tenants": got, "replicas": [{"admission": None}], "duration_s": 2.0}})
    assert lines[-1] == "one: admitted A:B 0.50 (sent from 3 s on: 0.00)"


def test_fleet_admission_refuses_bad_arguments(capsys, tmp_path):
    assert fleet_admission.main([str(tmp_path), "--runs", "nope"]) == 2
    assert "unknown run nope" in capsys.readouterr().err
    assert fleet_admission.main([str(tmp_path), "--rate", "0"]) == 2


def split(cached, workload, balancing, index):
    return {"cached_token_ratio": cached, "routing_loss": {
        "cached": cached, "lost_to_workload": workload, "lost_to_balancing": balancing, "lost_to_index": index}}


def test_the_gap_to_the_reference_is_split_by_cause():
    results = {"oracle": split(0.9, 0.1, 0.0, 0.0), "kv_aware": split(0.7, 0.15, 0.1, 0.05)}
    got = routing_loss_gap.compare(results, "oracle")["kv_aware"]
    assert got["gap"] == pytest.approx(0.2) and got["parts_sum"] == pytest.approx(0.2)
    assert got["parts"] == pytest.approx({"workload": 0.05, "balancing": 0.1, "index": 0.05})
    assert got["off"] == pytest.approx(0.0) and got["own_parts"] == pytest.approx(0.3)
    # an engine's cached share that the router's figures do not explain shows as `off`
    results["kv_aware"]["cached_token_ratio"] = 0.65
    assert routing_loss_gap.compare(results, "oracle")["kv_aware"]["off"] == pytest.approx(-0.05)


def test_routing_loss_gap_names_a_missing_reference(capsys, tmp_path):
    (tmp_path / "runs" / "kv_aware").mkdir(parents=True)
    (tmp_path / "runs" / "kv_aware" / "summary.json").write_text(json.dumps(split(0.5, 0.5, 0.0, 0.0)))
    assert routing_loss_gap.main(["bench", str(tmp_path), "--reference", "oracle"]) == 2
    assert "no run named oracle (have: kv_aware)" in capsys.readouterr().err
