"""The last batch of an epoch over several processes: accelerate keeps every process's batches even by filling a
short last batch with rows from the start of the epoch, which are then trained twice in that epoch (and the run
differs from one process's). Said once, with the fix."""

from typing import Any


def repeated_rows(count: int, per_device: int, processes: int, drop_last: bool) -> int:
    """How many rows accelerate repeats to fill the last batch of an epoch of `count` rows."""
    if processes < 2 or drop_last:
        return 0
    per_step = per_device * processes
    return (per_step - count % per_step) % per_step


def say_repeated_rows(args: Any, dataset: Any, unit: str, warn: Any) -> None:
    """`warn(reason, message)` when the training data's last batch is filled up with repeated rows."""
    if dataset is None or not hasattr(dataset, "__len__"):
        return
    count = len(dataset)
    repeated = repeated_rows(count, args.per_device_train_batch_size, args.world_size, args.dataloader_drop_last)
    if repeated == 0:
        return
    per_step = args.per_device_train_batch_size * args.world_size
    warn("RowsRepeated", f"{count} training {unit} over {args.world_size} processes x "
         f"{args.per_device_train_batch_size} per process: the last batch of each epoch is filled up with {repeated} "
         f"{unit} repeated from the start of the epoch (accelerate keeps the processes' batches even), so they are "
         f"trained twice in it; make the count a multiple of {per_step} (data.maxTrainSamples), or set "
         f"training.extraArgs.dataloader_drop_last: true to leave the last {count % per_step} out instead")
