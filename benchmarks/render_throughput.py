"""Validate + render cost per FineTuneJob, against parsing the spec with pydantic alone (measured in the same run).

The operator validates and renders on every reconcile, so this bounds the jobs/s one core can reconcile before
any API call. Usage: .venv/bin/python benchmarks/render_throughput.py [--seconds 2]
"""

import argparse
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "operator"))

from finetune_operator.api.spec import FineTuneJobSpec  # noqa: E402
from finetune_operator.api.validation import validate_job  # noqa: E402
from finetune_operator.render import RenderContext, render_all  # noqa: E402


def rate(fn, seconds: float) -> float:
    """Calls per second of `fn`, over at least `seconds`."""
    calls, started = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - started) < seconds:
        fn()
        calls += 1
    return calls / elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    print(f"{'example':<28}{'parse only/s':>14}{'validate+render/s':>20}{'ms/job':>9}{'ratio':>8}")
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        baseline = rate(lambda doc=doc: FineTuneJobSpec.model_validate(doc["spec"]), args.seconds)

        def full(doc: dict = doc) -> None:
            job = validate_job(doc)
            render_all(job.spec, RenderContext(name=job.name, namespace="default", job_labels=job.labels))

        ours = rate(full, args.seconds)
        print(f"{path.stem:<28}{baseline:>14.0f}{ours:>20.0f}{1000 / ours:>9.2f}{baseline / ours:>7.1f}x")


if __name__ == "__main__":
    main()
