"""The pod launcher: waits for node 0's DNS name (bounded), then execs torchrun with an argv list."""

import pytest

from finetune_trainer import launch


def test_torchrun_argv_is_a_list_with_no_topology_flags():
    # Topology comes from the PET_* env the operator renders; flags here would override it.
    assert launch.torchrun_argv("/etc/finetune/trainer.json") == [
        "torchrun", "--module", "finetune_trainer", "--config", "/etc/finetune/trainer.json"]


def test_waits_until_the_name_resolves():
    answers = iter([OSError("NXDOMAIN"), OSError("NXDOMAIN"), "10.0.0.7"])

    def resolve(host):
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert launch.wait_for_dns("job-a1-0.job.ns.svc", timeout=5, resolve=resolve, interval=0.01) >= 0
    with pytest.raises(StopIteration):
        next(answers)  # all three lookups happened


def test_gives_up_with_an_explanation():
    def never(host):
        raise OSError("NXDOMAIN")

    with pytest.raises(launch.DnsTimeout, match="headless Service"):
        launch.wait_for_dns("missing.svc", timeout=0.05, resolve=never, interval=0.01)


def test_main_returns_the_retryable_code_when_dns_never_resolves(monkeypatch):
    monkeypatch.setenv(launch.MASTER_ADDR_ENV, "no-such-host.invalid")
    assert launch.main(["--config", "/x", "--dns-timeout", "0"]) == launch.EXIT_DNS_TIMEOUT


def test_real_resolver_on_loopback():
    assert launch.wait_for_dns("localhost", timeout=5) < 5
