"""`finetune`: validate, render, crd and run FineTuneJob specs without a cluster."""

from .main import main

__all__ = ["main"]
