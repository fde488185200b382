"""GPU acceptance in one command: every figure the first time a GPU is lent, each case in its own process (one
failure hides none of the others), one JSON and one Markdown table in --out.

Cases (GPU sizes; --smoke runs each case's own code on CPU with a tiny model, sequence 128: SMOKE_SKIPS says
which it leaves out and why):
1. ours: full fine-tune of a ~1.1B Llama built from a config (random weights), bf16, sequence 4096, packing
   (text blocks), sdpa, through `finetune run`: tokens/s per GPU, MFU as progress.jsonl reports it and as an
   independent count from the model's shape (6N + attention), peak memory, loss.
2. hf_trainer / trl: the same model and data through a plain HF Trainer (DataCollatorForSeq2Seq padding) and TRL's
   SFTTrainer with packing: tokens/s and loss after the same steps, as ratios to ours.
3. Switches: gradient checkpointing, torch.compile, Liger kernels, LoRA on an 8B-shaped model, QLoRA (when
   bitsandbytes is there), FSDP2 and ZeRO-3 at world size 1: each end to end, its final model saved and reloaded.
4. first_step: process start to the first optimizer step of the 1B model with the tokenized data cached.
5. grpo: LoRA GRPO on the 1B model against TRL's GRPOTrainer called directly (benchmarks/gpu_grpo.py): seconds per
   step, the ratio, peak memory against the fit estimate.
6. in_place_restart: runPolicy.inPlaceRestarts on a ~45M-parameter Llama (a checkpoint every 2 steps), the training
   process killed (SIGKILL) after a checkpoint: torchrun's elastic agent starts a new one on the same node, its
   process group (NCCL on a GPU) is formed again through the c10d rendezvous, it resumes from that checkpoint and the
   run finishes; the recovery's phases.

On a GPU machine (no registry: hack/gpu-wheels.sh prepares the carry here):
  pip install -q --no-index --no-deps --no-build-isolation --target .gpu-site .gpu-wheels/* && \\
    PYTHONPATH=.gpu-site:operator:trainer_image python benchmarks/gpu_suite.py --out "$OUT/gpu" \\
      --work /tmp/gpu-work --jobs 3
Smoke (CPU, a test runs it): .venv/bin/python benchmarks/gpu_suite.py --smoke --out /tmp/gpu-smoke
"""


from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "operator"), str(ROOT / "trainer_image"), str(ROOT)]

from benchmarks.gpu_cases import CASE_SECONDS, CASES, GPU_1B, SMOKE, SkipCase, device  # noqa: E402
from tests.support.polling import NotWithin, wait_while_progressing  # noqa: E402

GOALS = {"mfu": 0.50, "vs_hf_trainer": 1.0, "vs_trl": 1.0, "first_step_seconds": 30.0, "grpo_vs_trl": 0.95}
SMOKE_SECONDS = 90
# Their tokens/s are the suite's figures: each runs alone on the device. The other cases prove that a switch runs,
# saves and reloads (and give its peak memory, which is per process): --jobs lets them share the device.
MEASURED_ALONE = ("ours", "hf_trainer", "trl", "first_step", "grpo")
# Smoke mode (a test on 2 shared cores) leaves these out; what needs a GPU or a package the venv lacks (QLoRA,
# FSDP2, Liger) skips itself. ZeRO-3 at world size 1 is case_ours with its spec field (SWITCHES, validated by
# tests/unit/test_gpu_suite_specs.py): gradient_checkpointing runs the same _switch code with the full model's reload,
# lora_8b_shaped with the adapter's, and ZeRO-3 trains and saves end to end in tests/e2e/test_trainer_runs.py::
# test_two_nodes[zero3]. first_step runs case_ours' job again (1 and 2 steps) for a timing only a GPU gives.
SMOKE_SKIPS = {"compile": "torch.compile is measured on a GPU only (inductor's CPU build would take minutes here)",
               "zero3": "case_ours with its spec field at world size 1; ZeRO-3 trains in test_two_nodes[zero3]",
               "first_step": "case_ours' job again, for a timing only a GPU run gives"}


# --- the driver -------------------------------------------------------------------------------------------------
def run_case(name: str, work: Path, smoke: bool, sharing: int = 1) -> dict:
    """In a process of its own, bounded in time; whatever happens, a result. `sharing`: how many cases ran at once.
    On a GPU a case gets twice its expected time. In smoke mode (a test, on a CPU other work may keep busy) it runs
    as long as it makes progress: it is stopped once nothing under `work` (its runs' logs, progress, outputs, its
    own output) changed for SMOKE_SECONDS x 2, or after SMOKE_SECONDS x 20 in all."""
    if smoke and name in SMOKE_SKIPS:
        return {"case": name, "status": "skipped", "why": SMOKE_SKIPS[name]}
    out = work / f"{name}.json"
    argv = [sys.executable, __file__, "--case", name, "--work", str(work), "--result", str(out)]
    started = time.monotonic()
    limit = SMOKE_SECONDS * 20 if smoke else CASE_SECONDS[name] * 2
    log = work / f"{name}.log"
    # A session of its own, killed whole at the limit: a case's `finetune run` and TRL's run are its children, and
    # left running they would hold the GPU under the next case's figures.
    with log.open("w") as output:
        proc = subprocess.Popen([*argv, *(["--smoke"] if smoke else [])], stdout=output, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
        why = wait_for_case(proc, work, limit, SMOKE_SECONDS * 2 if smoke else None)
    if why is not None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return {"case": name, "status": "failed", "error": why}
    result = json.loads(out.read_text()) if out.exists() else {
        "case": name, "status": "failed",
        "error": f"exited {proc.returncode}: {log.read_text(errors='replace')[-1500:]}"}
    result["seconds"] = round(time.monotonic() - started, 1)
    if sharing > 1:
        result["sharedDevice"] = sharing
    return result


def wait_for_case(proc: subprocess.Popen, work: Path, limit: float, stall: float | None) -> str | None:
    """None once the case exits; else why it is to be stopped: past `limit`, or silent for `stall` seconds (the
    tests' own wait for a run that makes progress)."""
    started = time.monotonic()
    try:
        wait_while_progressing(lambda: proc.poll() is not None, lambda: _progress(work), stall or limit, limit,
                               every=1)
    except NotWithin:
        if time.monotonic() - started > limit:
            return f"timed out after {limit:g} s"
        return f"timed out: nothing under {work} changed for {stall:g} s"
    return None


def _progress(work: Path) -> tuple[int, int]:
    """The newest change and the total size of the files under `work`."""
    newest = total = 0
    # os.walk, not Path.rglob: a directory renamed or removed while we walk (the trainer's tokenized-data .tmp
    # directory, a rotated checkpoint) is skipped; rglob raised FileNotFoundError and failed a smoke run.
    for root, dirs, files in os.walk(work):
        for name in (*dirs, *files):
            try:
                stat = os.stat(os.path.join(root, name))
            except OSError:  # removed while we looked
                continue
            newest, total = max(newest, stat.st_mtime_ns), total + stat.st_size
    return newest, total


def one_case(name: str, work: Path, smoke: bool, result: Path) -> None:
    size = SMOKE if smoke else GPU_1B
    gpu = not smoke
    try:
        figures = CASES[name](work, size, gpu)
        out = {"case": name, "status": "ok", "figures": figures}
    except SkipCase as exc:
        out = {"case": name, "status": "skipped", "why": str(exc)}
    except Exception as exc:  # every failure is a row of the table, not a lost run
        out = {"case": name, "status": "failed", "error": f"{type(exc).__name__}: {str(exc)[:1500]}"}
    result.write_text(json.dumps(out, default=str))


def table(results: list[dict], meta: dict) -> str:
    by = {r["case"]: r for r in results}
    ours = (by.get("ours") or {}).get("figures") or {}

    def rate(name: str) -> float | None:
        return ((by.get(name) or {}).get("figures") or {}).get("tokensPerSecondPerGpu")

    lines = [f"GPU suite on {meta['device']} ({'smoke, CPU' if meta['smoke'] else 'full'}), torch {meta['torch']}, "
             f"transformers {meta['transformers']}", "",
             "| case | status | tokens/s/GPU | vs ours | MFU (ours / independent) | peak GiB (predicted) | loss | s | "
             "goal |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        f = r.get("figures") or {}
        tps = f.get("tokensPerSecondPerGpu")
        vs = f"{rate('ours') / tps:.2f}x ours" if tps and rate("ours") and r["case"] in ("hf_trainer", "trl") else ""
        if f.get("vsTrl"):  # grpo: seconds per step, TRL's over ours
            vs = f"{f['vsTrl']:.2f}x TRL ({f['secondsPerStep']} s/step)"
            if f.get("steadyVsTrl"):
                vs += f"; after step 1: {f['steadyVsTrl']:.2f}x ({f['steadySecondsPerStep']} s/step)"
        mfu = "" if f.get("mfuReported") is None else f"{100 * f['mfuReported']:.1f}%" + (
            f" / {100 * f['mfuIndependent']:.1f}%" if f.get("mfuIndependent") else "")
        goals = {"ours": f"MFU >= {GOALS['mfu']:.0%}", "hf_trainer": "ours >= 1.0x", "trl": "ours >= 1.0x",
                 "first_step": f"first step < {GOALS['first_step_seconds']:.0f} s",
                 "grpo": f"ours >= {GOALS['grpo_vs_trl']}x TRL",
                 "in_place_restart": "a killed worker restarts in place, the run finishes"}
        goal = goals.get(r["case"], "runs, saves, reloads")
        status = r["status"] + (f": {r.get('why') or r.get('error', '')[:160]}" if r["status"] != "ok" else "")
        if r["case"] == "in_place_restart" and r["status"] == "ok":
            status += (f" ({f.get('backend')}: resumed from step {f.get('resumedStep')}, {f.get('lostSteps')} redone, "
                       f"first step {f.get('recoverySeconds')} s after the kill)")
        if r.get("sharedDevice") and r["status"] == "ok":
            status += f" ({r['sharedDevice']} cases at once: tokens/s not comparable)"
        peak = f"{f.get('peakMemoryGiB') or ''}" + (f" ({f['predictedPeakGiB']})" if f.get("predictedPeakGiB") else "")
        lines.append(f"| {r['case']} | {status} | {tps:.0f} | {vs} | {mfu} | {peak} | "
                     f"{f.get('loss') if f.get('loss') is not None else ''} | "
                     f"{f.get('secondsToFirstStep', r.get('seconds', ''))} | {goal} |" if tps else
                     f"| {r['case']} | {status} |  |  |  |  |  | {f.get('secondsToFirstStep', r.get('seconds', ''))} "
                     f"| {goal} |")
    if ours:
        lines += ["", f"ours: {ours.get('tokensPerSecondPerGpu')} tokens/s/GPU, peak {ours.get('peakMemoryGiB')} GiB"]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("gpu-suite"))
    parser.add_argument("--smoke", action="store_true", help="CPU, a tiny model: runs each case's code but SMOKE_SKIPS")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--jobs", type=int, default=1,
                        help=f"cases other than {', '.join(MEASURED_ALONE)} run this many at once (after those)")
    parser.add_argument("--case", help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help="models, data and runs (default: OUT/work; GBs on a GPU)")
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        one_case(args.case, args.work, args.smoke, args.result)
        return
    from concurrent.futures import ThreadPoolExecutor, as_completed

    import torch
    import transformers

    args.out.mkdir(parents=True, exist_ok=True)
    work = args.work or args.out / "work"
    work.mkdir(parents=True, exist_ok=True)
    meta = {"device": device(), "torch": torch.__version__, "transformers": transformers.__version__,
            "smoke": args.smoke, "jobs": args.jobs, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    names = args.cases.split(",")
    alone = [n for n in names if n in MEASURED_ALONE or args.jobs <= 1]
    shared = [n for n in names if n not in alone]
    results: list[dict] = []

    def record(result: dict) -> None:  # after every case: a run cut short still leaves what it measured
        results.append(result)
        (args.out / "results.json").write_text(json.dumps({"meta": meta, "goals": GOALS, "results": results},
                                                          indent=2, default=str))
        print(f"{result['case']}: {result['status']} ({result.get('seconds', 0)} s)", flush=True)

    for name in alone:
        record(run_case(name, work, args.smoke))
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for future in as_completed([pool.submit(run_case, n, work, args.smoke, min(args.jobs, len(shared)))
                                    for n in shared]):
            record(future.result())
    (args.out / "results.md").write_text(table(results, meta))
    print(table(results, meta))


if __name__ == "__main__":
    main()
