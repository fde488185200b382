"""finetune_trainer: the container entrypoint every FineTuneJob pod runs (launched by torchrun)."""

__version__ = "0.1.0"
