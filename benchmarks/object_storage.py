"""Checkpoints in object storage (output.uri) against the same run on a local volume, in one run, with a real S3
server (MinIO from its Go module, on this machine's loopback), through `finetune run`:

1. Step time while checkpoint uploads are in flight vs the same steps without uploads: a full fine-tune of a model
   whose checkpoint (weights + Adam states) is >= 1 GB, saved every --save-steps steps; the uploads run in the
   trainer's background thread. Goal: <= 5% slower.
2. Time from a (re)start to the first step: resuming from the bucket in an empty directory (the checkpoint is
   downloaded first) vs resuming from a local copy of the same checkpoint (a claim). Printed as a ratio.

On a 2-core machine the MinIO server shares the cores with training: by default it runs at nice 19, standing in for
a store on other machines (as S3, or MinIO on its own nodes, is), and --same-priority measures the worst case where
it competes with training. The uploads themselves run at nice 19 in the trainer (outputs/upload_files.py).
Usage: .venv/bin/python benchmarks/object_storage.py [--steps 24] [--save-steps 6] [--out FILE] [--tiny]
"""

from __future__ import annotations

import argparse
import calendar
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "operator"), str(ROOT / "trainer_image")]

ENV = {"TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}


def build_model(directory: Path, tiny: bool = False) -> Path:
    from finetune_trainer.tiny_model import build_tiny_model

    if tiny:  # the smoke run of tests/e2e/test_benchmarks_run.py
        return build_tiny_model(directory)
    # ~116M parameters: 464 MB of fp32 weights, ~1.4 GB with Adam's two states in a checkpoint.
    return build_tiny_model(directory, layers=4, hidden=1024, heads=16, kv_heads=16, intermediate=2816,
                            vocab_size=32000)


def job(model: Path, steps: int, save_steps: int, uri: str | None, endpoint: str) -> dict:
    doc = yaml.safe_load((ROOT / "examples" / "tiny-cpu-sft.yaml").read_text())
    spec = doc["spec"]
    spec["model"]["name"] = str(model)
    spec["method"] = {"type": "full"}
    spec["training"].update(maxSteps=steps, learningRate=1e-4, loggingSteps=1, perDeviceTrainBatchSize=2)
    spec["checkpoints"] = {"saveSteps": save_steps, "keep": 2}
    if uri:
        spec["output"] = {"uri": uri}
        spec["s3"] = {"endpointURL": endpoint, "region": "us-east-1"}
    return doc


def run(doc: dict, workdir: Path, env: dict[str, str]) -> tuple[float, list[dict]]:
    """Seconds from start to this run's first step record, and this run's step records."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "job.yaml").write_text(yaml.safe_dump(doc))
    started = time.time()
    proc = subprocess.run([sys.executable, "-m", "finetune_operator", "run", str(workdir / "job.yaml"),
                           "--output", str(workdir / "run")], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **ENV, **env})
    if proc.returncode != 0:
        raise SystemExit(f"run failed ({proc.returncode}):\n{proc.stdout[-3000:]}")
    records = [json.loads(line) for line in (workdir / "run/output/progress.jsonl").read_text().splitlines()]
    # This run's steps only: a resume from the bucket restores the earlier run's history into the file too.
    since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(started)))
    steps = [r for r in records if r.get("phase") != "Preparing" and r.get("tokensPerSecond")
             and r.get("time", "") >= since]
    first = min(calendar.timegm(time.strptime(r["time"], "%Y-%m-%dT%H:%M:%SZ")) for r in steps)  # UTC
    return first - started, steps


def step_seconds(record: dict, tokens_per_step: float) -> float:
    return tokens_per_step / record["tokensPerSecond"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--save-steps", type=int, default=6)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--tiny", action="store_true", help="a tiny model: checks the harness, measures nothing")
    parser.add_argument("--same-priority", action="store_true",
                        help="run MinIO at the trainer's priority (by default it is niced: a store on other machines)")
    args = parser.parse_args()
    from tests.support.minio import MinIO, build_components

    with tempfile.TemporaryDirectory(prefix="object-storage-bench-") as tmp:
        work = Path(tmp)
        server = MinIO(build_components()["minio"] / "minio", work=work / "minio", niced=not args.same_priority).start()
        try:
            bucket = server.bucket("bench")
            model = build_model(work / "model", args.tiny)
            # Two threads for the runs that measure; --tiny measures nothing and keeps the caller's (the tests': one).
            env = {**server.env, **({} if args.tiny else {"OMP_NUM_THREADS": "2"})}
            local_first, local = run(job(model, args.steps, args.save_steps, None, server.url), work / "local", env)
            uri = f"{bucket}/runs/bench"
            remote_first, remote = run(job(model, args.steps, args.save_steps, uri, server.url), work / "remote", env)
            checkpoint = max((work / "local/run/output").glob("checkpoint-*"), key=lambda p: int(p.name[11:]))
            size = sum(f.stat().st_size for f in checkpoint.rglob("*") if f.is_file())
            tokens = statistics.median(r["tokensSeen"] / r["step"] for r in local if r["step"])
            # Steps while an upload was in flight (the record says uploads are pending), and the same steps locally.
            busy = {r["step"] for r in remote if (r.get("upload") or {}).get("pending")}
            by_step = {r["step"]: r for r in local}
            with_uploads = [step_seconds(r, tokens) for r in remote if r["step"] in busy]
            same_steps = [step_seconds(by_step[s], tokens) for s in sorted(busy) if s in by_step]
            # A restart: one more step, resuming from the bucket into an empty directory, or from a local copy.
            more = args.steps + 1
            from_bucket, _ = run(job(model, more, args.save_steps, uri, server.url), work / "restart-bucket", env)
            claim = work / "restart-claim/run/output"
            shutil.copytree(checkpoint, claim / checkpoint.name)
            from_claim, _ = run(job(model, more, args.save_steps, None, server.url), work / "restart-claim", env)
        finally:
            server.stop()
    figures = {
        "checkpointBytes": size, "stepsWithUploadsInFlight": len(with_uploads),
        "stepSecondsWithUploads": statistics.median(with_uploads) if with_uploads else None,
        "stepSecondsWithout": statistics.median(same_steps) if same_steps else None,
        "restartToFirstStepSecondsFromBucket": round(from_bucket, 1),
        "restartToFirstStepSecondsFromClaim": round(from_claim, 1),
        "firstStepSecondsLocal": round(local_first, 1), "firstStepSecondsRemote": round(remote_first, 1),
        "cpus": os.cpu_count(), "loadAverage": os.getloadavg(),
    }
    if figures["stepSecondsWithUploads"] and figures["stepSecondsWithout"]:
        figures["slowdown"] = figures["stepSecondsWithUploads"] / figures["stepSecondsWithout"]
    figures["restartRatio"] = from_bucket / from_claim
    print(f"checkpoint: {size / 2**30:.2f} GiB (weights + Adam states), {args.steps} steps, save every "
          f"{args.save_steps}, {os.cpu_count()} cpus")
    if "slowdown" in figures:
        print(f"step time with uploads in flight: {figures['stepSecondsWithUploads']:.2f} s vs "
              f"{figures['stepSecondsWithout']:.2f} s without ({len(with_uploads)} steps): "
              f"{100 * (figures['slowdown'] - 1):+.1f}% (goal <= +5%)")
    print(f"restart to first step: from the bucket {from_bucket:.1f} s vs from a claim {from_claim:.1f} s "
          f"({figures['restartRatio']:.2f}x)")
    if args.out:
        args.out.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
