"""The operator process: `python -m finetune_operator.controller [--all-namespaces | --namespace NS ...]`.

Serves /healthz (health.py) at once, waits to lead when --leader-elect is given (leadership.py: the chart runs two
replicas, one active), then runs kopf with our handlers until SIGTERM, and hands the Lease over on the way out.
"""

import argparse
import logging
import os
import socket
import sys
import threading
import uuid

import kopf
from kubernetes import client, config

from ..api import constants as c
from .fencing import FENCE, fenced_configuration
from .health import HEALTH, serve
from .leadership import LeaseElector, Timing

log = logging.getLogger("finetune_operator")
DEFAULT_LEASE = "finetunejob-operator"


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m finetune_operator.controller", description=__doc__)
    scope = parser.add_mutually_exclusive_group(required=True)
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="watch every namespace")
    scope.add_argument("--namespace", "-n", action="append", help="watch this namespace (repeatable)")
    parser.add_argument("--health-port", type=int, default=c.OPERATOR_HEALTH_PORT,
                        help="port of GET /healthz (0: none)")
    parser.add_argument("--leader-elect", action="store_true",
                        help="lead through a Lease before reconciling (two or more replicas, one active)")
    parser.add_argument("--lease-namespace", default=os.environ.get("POD_NAMESPACE", ""),
                        help="namespace of the Lease (default: $POD_NAMESPACE)")
    parser.add_argument("--lease-name", default=DEFAULT_LEASE)
    parser.add_argument("--identity", default=os.environ.get("POD_NAME") or f"{socket.gethostname()}-"
                        f"{uuid.uuid4().hex[:6]}", help="this replica's name in the Lease (default: $POD_NAME)")
    args = parser.parse_args(argv)
    if args.leader_elect and not args.lease_namespace:
        parser.error("--leader-elect needs --lease-namespace (or $POD_NAMESPACE, the chart's downward API)")
    return args


def coordination_api() -> client.CoordinationV1Api:
    """The Lease's own client: not fenced (it is what keeps the fence open), no client retries (each renewal is
    bounded by the renew deadline, and a resent renewal conflicts with itself), resets on close."""
    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)
    except config.ConfigException:
        config.load_kube_config(client_configuration=configuration)
    return client.CoordinationV1Api(client.ApiClient(fenced_configuration(configuration, retry_reads=0)))


def lost(why: str) -> None:
    """Another replica may write from now on: stop at once, mid-pass if need be (passes are idempotent), and let
    the kubelet restart us as a standby. The fence already refuses every write; the exit resets every connection
    (fencing.py), so nothing of ours still on its way lands later."""
    FENCE.release()
    log.error("leader election: lost the lead (%s); exiting so that one replica writes", why)
    logging.shutdown()
    os._exit(1)


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    kopf.configure(verbose=False)
    if args.health_port:
        serve(HEALTH, "0.0.0.0", args.health_port)
    elector, renewer, renewing = None, None, threading.Event()
    if args.leader_elect:
        HEALTH.role = "standby"
        elector = LeaseElector(coordination_api(), args.lease_namespace, args.lease_name, args.identity, Timing(),
                               fence=FENCE)
        if not elector.acquire(threading.Event()):
            return 1
        renewer = HEALTH.renewer = elector.hold(renewing, lost)
    HEALTH.role = "leader"
    from . import handlers  # noqa: F401 - registers the handlers with kopf; imported once we may write
    try:
        kopf.run(standalone=True, clusterwide=bool(args.all_namespaces), namespaces=args.namespace or ())
    finally:
        if elector is not None and renewer is not None:
            renewing.set()  # else the renewal would take the released Lease straight back
            renewer.join(timeout=Timing().retry * 3)
            elector.release()
    return 0
