"""Benchmarks only (benchmarks/memory_measured.py puts this directory first on PYTHONPATH): every process started
with FINETUNE_PEAK_PROBE=DIR counts what torch holds (tests/support/memory_probe.PeakTracker) and, when
transformers' Trainer.train returns, writes the peak over the training to DIR/peak-<rank>.json: counted from what
the model holds when training starts (its parameters and buffers), then every storage an op creates. No product
code knows about it."""

import os

if os.environ.get("FINETUNE_PEAK_PROBE"):
    import importlib.abc
    import importlib.machinery
    import json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
    from tests.support.memory_probe import PeakTracker, state_tensors

    _tracker = PeakTracker()
    _tracker.__enter__()  # from the first op of the process: the model's weights as they are loaded, too

    def _patch(trainer_module) -> None:
        original = trainer_module.Trainer.train

        def train(self, *args, **kwargs):
            _tracker.restart(state_tensors(self.model, getattr(self, "optimizer", None)))
            start = _tracker.live
            try:
                return original(self, *args, **kwargs)
            finally:
                rank = os.environ.get("RANK", "0")
                out = Path(os.environ["FINETUNE_PEAK_PROBE"]) / f"peak-{rank}.json"
                out.write_text(json.dumps({"rank": int(rank), "peak": _tracker.peak, "atStart": start,
                                           "atEnd": _tracker.live}))

        trainer_module.Trainer.train = train

    class _AfterImport(importlib.abc.MetaPathFinder):
        """Patches transformers.trainer right after it is imported (importing it here would slow every process)."""

        def find_spec(self, name, path, target=None):
            if name != "transformers.trainer":
                return None
            sys.meta_path.remove(self)
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is None or spec.loader is None:
                return spec
            loader = spec.loader
            original_exec = loader.exec_module

            def exec_module(module):
                original_exec(module)
                _patch(module)

            loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _AfterImport())
