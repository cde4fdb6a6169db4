"""The fault alerts on a real Prometheus server: four hours of series (tests/monitoring/faults.py) in which each fault
starts, persists for over an hour and clears, loaded with `promtool tsdb create-blocks-from openmetrics`.

A Prometheus server does not evaluate rules over data it did not scrape itself, so the test evaluates each rule's
expression with the server's own query_range, one step a minute as the rule group does, and applies `for` the way
the rule manager does (firing once the expression has held at every evaluation for that long). The same rules'
exact firing behaviour is also checked by `promtool test rules` (tests/monitoring/alerts-test.yaml).
"""
from __future__ import annotations

import pytest

from gpu_bootstrap.render import gpu_alerts
from tests.monitoring import faults
from tests.monitoring.live import LocalPrometheus
from tests.tools import run, tool

pytestmark = [pytest.mark.tools, pytest.mark.slow]
STEP = 60


def seconds(duration: str | None) -> int:
    if not duration:
        return 0
    units = {"s": 1, "m": 60, "h": 3600}
    return int(duration[:-1]) * units[duration[-1]]


@pytest.fixture(scope="module")
def firing(tmp_path_factory) -> dict[str, dict[tuple, set[int]]]:
    """alert -> {its series' identifying labels: the minutes at which it fires}, over the four hours."""
    folder = tmp_path_factory.mktemp("faults")
    (folder / "series.om").write_text(faults.openmetrics())
    run([tool("promtool"), "tsdb", "create-blocks-from", "openmetrics", str(folder / "series.om"),
         str(folder / "data")], {}, timeout=300)
    server = LocalPrometheus(folder, "global: {scrape_interval: 1h}\n")
    try:
        out = {}
        for rule in gpu_alerts.rules():
            hold = seconds(rule.get("for")) // STEP
            found = {}
            for series in server.query_range(rule["expr"], faults.at(0), faults.at(faults.MINUTES), STEP):
                key = tuple(series["metric"].get(k, "") for k in ("gpu", "pod", "name"))
                present = {(int(float(t)) - faults.T0) // 60 for t, _v in series["values"]}
                found[key] = {m for m in present if all(m - i in present for i in range(hold + 1))}
            out[rule["alert"]] = found
        yield out
    finally:
        server.stop()


def test_a_persisting_xid_79_fires_at_10_and_60_minutes_and_stops_after_it_clears(firing):
    minutes = firing["GpuXidHardwareFault"][("3", "", "")]
    assert {40, 90, 149} <= minutes  # 10 and 60 minutes after it appeared at 30m, and to the end
    assert minutes == set(range(30, 150))  # nothing before it, nothing after DCGM reports 0 again
    assert set(firing["GpuXidHardwareFault"]) == {("3", "", "")}  # the XID 13 GPU is not a hardware fault


def test_an_xid_13_fires_and_stops_within_its_window_while_the_gauge_keeps_13(firing):
    minutes = firing["GpuXidErrorReported"][("1", "", "")]
    assert 61 in minutes and 85 in minutes and max(minutes) <= 90 and min(minutes) >= 60
    assert not {m for m in range(95, faults.MINUTES + 1)} & minutes  # the gauge still says 13: no news
    assert set(firing["GpuXidErrorReported"]) == {("1", "", "")}  # 79 is reported once, as a hardware fault


def test_a_gpu_pod_pending_on_our_scheduler_fires_after_15_minutes_until_it_is_bound(firing):
    minutes = firing["GpuPodsPendingOnBinpackScheduler"][("", "wait-0", "")]
    assert min(minutes) == 25  # created at 10m, default gpu_pod_pending_for 15m
    assert {30, 60, 120, 159} <= minutes and not {m for m in minutes if m >= 166}  # bound at 160m (+ lookback)
    assert set(firing["GpuPodsPendingOnBinpackScheduler"]) == {("", "wait-0", "")}  # not the look-alikes


def test_the_webhook_alert_fires_while_calls_fail_and_not_for_denials_or_other_webhooks(firing):
    minutes = firing["GpuAdmissionWebhookFailing"][("", "", faults.WEBHOOK)]
    assert not {m for m in minutes if m < 65}  # failures from 60m, held 5 minutes
    assert {66, 100, 139} <= minutes and not {m for m in minutes if m >= 156}  # 10m window after 140m, + 5m
    assert set(firing["GpuAdmissionWebhookFailing"]) == {("", "", faults.WEBHOOK)}


def test_nothing_else_fires_on_the_fault_series(firing):
    quiet = {name for name, found in firing.items() if not found}
    assert quiet == {r["alert"] for r in gpu_alerts.rules()} - {
        "GpuXidHardwareFault", "GpuXidErrorReported", "GpuPodsPendingOnBinpackScheduler",
        "GpuAdmissionWebhookFailing"}
