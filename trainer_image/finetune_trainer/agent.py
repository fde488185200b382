"""torchrun's elastic agent for an attempt that restarts in place, with the trainer's libraries imported once per
pod instead of once per worker.

A worker group re-formed in place (a failed worker, a lost node, a joining one) starts new worker processes; with
torchrun's `--module` each of them imports torch, transformers, peft, datasets and accelerate again, which is most
of a recovery (seconds on a GPU node, half a minute on a busy CPU). Here the agent imports them first and forks its
workers (torch elastic's "fork" start method for a function entrypoint), so a new worker starts with them loaded.
The agent itself is torchrun's (`torch.distributed.run`'s arguments, read from the same PET_* variables), only the
entrypoint differs: finetune_trainer.main in the forked process, its exit code the worker's.

Forking is safe here because the agent has touched no GPU (torch's CUDA check goes through NVML, which creates no
CUDA context) and no process group; the libraries a job cannot use are left out first (unused_libraries.py), as
in a worker.
"""

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

# Imported by every worker before its first step (finetune_trainer.main and what it imports lazily).
PRELOAD = ("torch", "torch.distributed", "accelerate", "datasets", "peft", "transformers", "transformers.trainer",
           "transformers.modeling_utils", "transformers.models.auto.modeling_auto", "finetune_trainer.main",
           "finetune_trainer.training.trainer", "finetune_trainer.training.callbacks",
           "finetune_trainer.training.worker_report", "finetune_trainer.training.model", "finetune_trainer.data",
           "finetune_trainer.outputs.status_report")
ENV_NVML_CUDA_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"


def preload(config: str) -> None:
    from finetune_trainer.config import load_config
    from finetune_trainer.unused_libraries import leave_out, unused_libraries

    leave_out(unused_libraries(load_config(config).spec))
    for name in PRELOAD:
        importlib.import_module(name)


def train(config: str) -> None:
    """One worker: the trainer's main(); a failure's exit code is the process's."""
    from finetune_trainer.main import main

    code = main(["--config", config])
    if code:
        sys.exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="finetune_trainer.agent")
    parser.add_argument("--config", required=True)
    args = parser.parse_args(argv)
    os.environ.setdefault(ENV_NVML_CUDA_CHECK, "1")  # before torch: its GPU check must not initialize CUDA
    preload(args.config)
    from torch.distributed.launcher.api import elastic_launch
    from torch.distributed.run import config_from_args, get_args_parser

    launch = get_args_parser().parse_args(["--start-method=fork", "--module", "finetune_trainer", "--config",
                                           args.config])
    launch_config, _, _ = config_from_args(launch)
    elastic_launch(launch_config, entrypoint=train)(args.config)
    return 0


if __name__ == "__main__":
    sys.exit(main())
