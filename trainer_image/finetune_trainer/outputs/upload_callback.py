"""The Trainer's side of output.uri: each save is handed to the node's uploader, unless another run took the
prefix over (outputs/owner.py), in which case the whole gang stops training."""

from pathlib import Path
from typing import Any

from transformers import TrainerCallback


class UploadCallback(TrainerCallback):
    """After each save every rank waits until all have written their files; the ranks agree whether the prefix is
    still this run's (the main process reads the owner record; one collective, so no rank stops alone); then the
    node's first process hands the checkpoint to the node's uploader, which snapshots it."""

    def __init__(self, remote: Any):
        self.remote = remote  # a RemoteOutput

    def on_save(self, args, state, control, **kwargs):
        import torch
        import torch.distributed as dist

        lost = self.remote.lost_here()
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            flag = torch.tensor([1 if lost else 0], dtype=torch.int32, device=args.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # also the barrier: every rank has written its files
            lost = bool(flag.item())
        if lost:
            self.remote.lost = True
            control.should_training_stop = True
            return
        if self.remote.uploader is not None:
            self.remote.uploader.submit(Path(args.output_dir) / f"checkpoint-{state.global_step}")
