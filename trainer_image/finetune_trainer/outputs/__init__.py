"""Outputs: checkpoints and their marks, uploads to object storage, the Hub, experiment trackers, loss.png, and
the status reports to the FineTuneJob."""
