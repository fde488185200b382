"""FineTuneJob operator: API models, pure rendering, Kubernetes I/O and the `finetune` CLI."""

__version__ = "0.1.0"
