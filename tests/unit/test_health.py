"""The operator's liveness verdict (controller/health.py): alive means able to reconcile."""

import json
import threading
import urllib.error
import urllib.request

import pytest

from finetune_operator.controller.health import Health, serve

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def leader(clock: Clock, oldest: float | None = None) -> Health:
    health = Health(stuck_pass_seconds=300, loop_stall_seconds=60, clock=clock, role="leader",
                    oldest_pass=lambda: oldest)
    health.tick()
    return health


def test_a_leader_with_a_ticking_loop_and_short_passes_is_healthy():
    clock = Clock()
    health = leader(clock, oldest=clock.now - 2)
    clock.now += 30
    ok, report = health.verdict()
    assert ok and report["role"] == "leader" and "problems" not in report


def test_a_pass_past_the_limit_fails_the_probe_naming_it():
    clock = Clock()
    health = leader(clock, oldest=clock.now)
    clock.now += 301
    health.tick()  # the loop still runs: kopf's own endpoint would answer 200 here
    ok, report = health.verdict()
    assert not ok and report["problems"] == ["a reconcile pass has run for 301 s (limit 300)"]


def test_a_stalled_event_loop_fails_the_probe():
    clock = Clock()
    health = leader(clock)
    clock.now += 61
    ok, report = health.verdict()
    assert not ok and report["problems"] == ["the event loop has not run for 61 s"]


def test_a_dead_lease_renewal_fails_the_probe_and_a_standby_is_healthy_whatever_it_has_not_started():
    clock = Clock()
    health = leader(clock)
    health.renewer = threading.Thread(target=lambda: None)
    health.renewer.start()
    health.renewer.join()
    assert health.verdict() == (False, {"role": "leader", "loopTickAgeSeconds": 0.0,
                                        "problems": ["the lease renewal stopped"]})
    standby = Health(clock=clock, role="standby", oldest_pass=lambda: 0.0)
    assert standby.verdict() == (True, {"role": "standby"})


def test_served_over_http_with_the_verdict_as_status_code():
    clock = Clock()
    health = leader(clock)
    server = serve(health, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.server_address[1]}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            assert response.status == 200 and json.loads(response.read())["role"] == "leader"
        clock.now += 120
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url, timeout=5)
        assert refused.value.code == 503 and "event loop" in json.loads(refused.value.read())["problems"][0]
    finally:
        server.shutdown()
