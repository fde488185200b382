"""A server whose port another process took between the pick and the bind starts again on another port (etcd,
kube-apiserver, MinIO); a failure of another kind is not retried."""

import socket
from collections.abc import Iterator

import pytest

from finetune_operator.cli.ports import free_port
from tests.support import controlplane, minio
from tests.support.controlplane import ControlPlane, build_binaries
from tests.support.minio import MinIO, build_components
from tests.support.port_retry import start_on_free_ports


@pytest.fixture
def taken() -> Iterator[int]:
    """A port something else listens on: what a pick meets when another process was quicker."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def picks_taken_first(taken: int, times: int):
    """free_port as it is, except that its first `times` answers are the taken port."""
    left = [times]

    def pick() -> int:
        if left[0] > 0:
            left[0] -= 1
            return taken
        return free_port()
    return pick


def test_etcd_and_the_apiserver_start_on_other_ports_when_theirs_were_taken(taken, monkeypatch):
    monkeypatch.setattr(controlplane, "free_port", picks_taken_first(taken, 3))  # etcd's client and peer, then again
    cp = ControlPlane(bin_dir=build_binaries())
    try:
        cp._start_etcd()
        assert f":{taken}" not in cp.etcd_url
        monkeypatch.setattr(controlplane, "free_port", picks_taken_first(taken, 1))
        cp._start_apiserver()
        assert cp.api_port != taken
        assert controlplane._http_ok(f"{cp.server}/readyz", controlplane.ADMIN_TOKEN)
        kept = sorted(p.name for p in cp.work.glob("*.port-taken-*.log"))
        assert [n.split(".")[0] for n in kept] == ["etcd", "etcd", "kube-apiserver"], kept
    finally:
        cp.stop(remove=True)


def test_minio_starts_on_another_port_and_a_restart_keeps_its_own(taken, monkeypatch):
    monkeypatch.setattr(minio, "free_port", picks_taken_first(taken, 1))
    server = MinIO(build_components()["minio"] / "minio")
    try:
        server.start()
        assert server.port not in (0, taken)
        port = server.port
        server.stop()
        server.start(port)
        assert server.port == port
    finally:
        server.stop(remove=True)


def test_a_failure_of_another_kind_is_raised_at_once():
    calls = []

    def start() -> None:
        calls.append(1)
        raise RuntimeError("etcd exited with 1: member has already been bootstrapped")

    with pytest.raises(RuntimeError, match="bootstrapped"):
        start_on_free_ports(start, lambda: calls.append(0))
    assert calls == [1]


def test_a_port_taken_every_time_gives_up_after_the_last_attempt():
    calls = []

    def start() -> None:
        calls.append(1)
        raise RuntimeError("listen tcp 127.0.0.1:4000: bind: address already in use")

    with pytest.raises(RuntimeError, match="already in use"):
        start_on_free_ports(start, lambda: None, attempts=3)
    assert len(calls) == 3
