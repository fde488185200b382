"""The pod's command: wait until node 0's DNS name resolves, then exec torchrun on the trainer module.

Headless-Service DNS records appear a moment after the pods do; torchrun started before that fails its rendezvous
(pytorch-operator#333). torchrun itself reads PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR and
PET_MASTER_PORT from the environment the operator rendered, so the argv below carries no topology.
"""

import argparse
import os
import socket
import sys
import time
from collections.abc import Callable, Sequence

MASTER_ADDR_ENV = "PET_MASTER_ADDR"
EXIT_DNS_TIMEOUT = 3  # retryable: the operator restarts the attempt


class DnsTimeout(RuntimeError):
    """Node 0's name never resolved: usually the headless Service or its subdomain is missing."""


def torchrun_argv(config: str) -> list[str]:
    """torchrun --module finetune_trainer --config CONFIG (an argv list, never a shell string)."""
    return ["torchrun", "--module", "finetune_trainer", "--config", config]


def wait_for_dns(host: str, timeout: float, resolve: Callable[[str], object] = socket.gethostbyname,
                 interval: float = 1.0) -> float:
    """Blocks until `host` resolves; returns the seconds waited or raises DnsTimeout."""
    started = time.monotonic()
    while True:
        try:
            resolve(host)
            return time.monotonic() - started
        except OSError as exc:
            if time.monotonic() - started >= timeout:
                raise DnsTimeout(f"{host} did not resolve within {timeout:.0f}s ({exc}); check that the headless "
                                 "Service exists and the pods' subdomain matches it") from exc
            time.sleep(interval)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="finetune_trainer.launch")
    parser.add_argument("--config", required=True, help="trainer.json mounted from the ConfigMap")
    parser.add_argument("--dns-timeout", type=float, default=600.0, help="seconds to wait for node 0's DNS name")
    args = parser.parse_args(argv)
    master = os.environ.get(MASTER_ADDR_ENV)
    if master:
        try:
            waited = wait_for_dns(master, args.dns_timeout)
        except DnsTimeout as exc:
            print(f"finetune launch: {exc}", file=sys.stderr)
            return EXIT_DNS_TIMEOUT
        print(f"finetune launch: {master} resolved after {waited:.1f}s", file=sys.stderr)
    command = torchrun_argv(args.config)
    os.execvp(command[0], command)
    return 0  # not reached: execvp replaces the process


if __name__ == "__main__":
    sys.exit(main())
