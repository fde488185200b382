"""One node of a 1-node elastic job (min = max = 1) as a pod runs it: finetune_trainer.launch's supervision (the
pod's exit code and termination message) over finetune_trainer.agent.run_elastic and torch's elastic launch on a
c10d rendezvous. Node "a" hosts the rendezvous's store, as node 0's agent does in a pod. Its worker (forked, as the
agent's are) writes WORKDIR/<name>.started, waits for WORKDIR/release and ends as the trainer does: its result for
the launcher, then exit 0, or exit 3 where WORKDIR/fail exists. A second node started while the first trains finds
the round full and waits in torch's redundancy list.

python tests/support/redundant_agent.py PORT WORKDIR NAME          the pod (WORKDIR/<name>.termination.json)
python tests/support/redundant_agent.py PORT WORKDIR NAME --agent  the agent alone, as the launcher starts it"""

import json
import os
import sys
import time
from pathlib import Path

WAIT_SECONDS = 120
FAILED = 3


def work(workdir: str, name: str) -> int:
    from finetune_operator.api import constants as c

    folder = Path(workdir)
    (folder / f"{name}.started").touch()
    deadline = time.monotonic() + WAIT_SECONDS
    while not (folder / "release").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    code = FAILED if (folder / "fail").exists() else 0
    result = Path(os.environ[c.ENV_RESULT_DIR], f"result-{os.environ.get(c.ENV_LOCAL_RANK, '0')}.json")
    result.write_text(json.dumps({"exitCode": code}))
    if code:
        sys.exit(code)
    return 0


def agent(port: int, workdir: str, name: str) -> int:
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from finetune_trainer.agent import run_elastic

    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=1, run_id="redundant", rdzv_backend="c10d",
                          rdzv_endpoint=f"127.0.0.1:{port}", max_restarts=0, monitor_interval=0.1,
                          start_method="fork", rdzv_configs={"is_host": name == "a", "join_timeout": 60,
                                                             "last_call_timeout": 1})
    return run_elastic(lambda: elastic_launch(config, entrypoint=work)(workdir, name))


def pod(port: int, workdir: str, name: str) -> int:
    from finetune_operator.api import constants as c
    from finetune_trainer import launch

    os.environ[c.ENV_TERMINATION_LOG] = str(Path(workdir) / f"{name}.termination.json")
    child = launch.Child([sys.executable, __file__, str(port), workdir, name, "--agent"], name="the agent")
    return launch.supervise(child, worker_required=True)


if __name__ == "__main__":
    run = agent if sys.argv[4:] == ["--agent"] else pod
    sys.exit(run(int(sys.argv[1]), sys.argv[2], sys.argv[3]))
