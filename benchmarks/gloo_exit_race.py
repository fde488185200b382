"""The crash of issue 42 without a trainer: two gloo processes do a few all_reduces and exit, with and without
destroying their process group first. Left to the interpreter's exit, a worker thread of the group may drop the last
reference to a finished collective's tensor while Python finalizes; the GIL that release needs is gone, the thread is
torn down inside a C++ destructor, and the process dies of SIGABRT ("terminate called without an active exception").
finetune_trainer.main.release_process_group destroys the group first.

Usage: OMP_NUM_THREADS=1 .venv/bin/python benchmarks/gloo_exit_race.py [--runs 60]
Prints, for each way out, how many of the launches had a process abort.
"""

import argparse
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

WORKER = """
import os, sys
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
for _ in range(3):
    dist.all_reduce(torch.ones(4096))
dist.all_reduce(torch.tensor([1]))
if os.environ["DESTROY"] == "1":
    dist.destroy_process_group()
sys.exit(0)
"""


def launch(script: Path, destroy: bool) -> bool:
    """One torchrun of two processes; True when one of them aborted."""
    env = {**os.environ, "DESTROY": "1" if destroy else "0", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                           str(random.randint(20000, 40000)), str(script)], env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    return "terminate called" in proc.stdout + proc.stderr or "exitcode: -6" in proc.stdout + proc.stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=60)
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "worker.py"
        script.write_text(WORKER)
        for destroy in (False, True):
            aborted = sum(launch(script, destroy) for _ in range(opts.runs))
            print(f"{'destroy_process_group() first' if destroy else 'left to the exit'}: {aborted} of {opts.runs} "
                  "launches aborted", flush=True)


if __name__ == "__main__":
    main()
