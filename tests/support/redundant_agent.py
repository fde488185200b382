"""One node of a 1-node elastic job (min = max = 1), run through finetune_trainer.agent.run_elastic and torch's
elastic launch on a c10d rendezvous whose store the caller hosts. Its worker (forked, as the agent's are) writes
WORKDIR/<name>.started and waits for WORKDIR/release; a second node started while it trains finds the round full
and waits in torch's redundancy list.

python tests/support/redundant_agent.py PORT WORKDIR NAME"""

import sys
import time
from pathlib import Path

WAIT_SECONDS = 120


def work(workdir: str, name: str) -> int:
    folder = Path(workdir)
    (folder / f"{name}.started").touch()
    deadline = time.monotonic() + WAIT_SECONDS
    while not (folder / "release").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return 0


def main(port: int, workdir: str, name: str) -> None:
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from finetune_trainer.agent import run_elastic

    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=1, run_id="redundant", rdzv_backend="c10d",
                          rdzv_endpoint=f"127.0.0.1:{port}", max_restarts=0, monitor_interval=0.1,
                          start_method="fork", rdzv_configs={"is_host": False, "join_timeout": 60,
                                                             "last_call_timeout": 1})
    run_elastic(lambda: elastic_launch(config, entrypoint=work)(workdir, name))
    print(f"{name}: launch returned", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], sys.argv[3])
