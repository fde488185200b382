"""`finetune`: validate, render, print the CRD and run FineTuneJob specs, without a cluster.

Exit codes: 0 ok; 1 `validate`/`render` found an invalid spec; 2 a file cannot be read or is not YAML (or the
command line is wrong); 3 `validate` found a valid spec that cannot run: it does not fit its GPUs (or its pods'
memory), or the stack cannot build it, by the model's config (--model-config, or a local model directory).
`run` exits with the trainer's code (README: exit codes), 78 (InvalidConfig) for an invalid spec, like the trainer
would.
"""

import argparse
import copy
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .. import __version__
from ..api import exit_codes
from ..api.constants import DEFAULT_TRAINER_IMAGE
from ..api.crd import all_crds_yaml
from ..api.elastic import accumulation_steps, in_place_restart_limit
from ..api.errors import FieldError, InvalidSpec
from ..api.runtime_layers import resolve_offline
from ..api.transformers_names import TRANSFORMERS_VERSION
from ..api.validation import ValidatedJob, advice, validate_job
from ..render import RenderContext, render_all, render_trainer_identity
from .manifests import STDIN, ManifestError, dump_documents, load_documents, load_yaml
from .memory import MODEL_CONFIG_HELP, memory_text, memory_verdict

EXIT_OK, EXIT_INVALID, EXIT_USAGE, EXIT_DOES_NOT_FIT = 0, 1, 2, 3
EXIT_RUN_INVALID = exit_codes.CONFIG_ERROR
OUTPUT_FORMATS = ("text", "json", "yaml")
RUNTIME_HELP = ("FineTuneRuntime / ClusterFineTuneRuntime YAML (repeatable): the job runs over the one its "
                "spec.runtimeRef names, else over the default ones, with their locks and limits checked, as on a "
                "cluster")


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return int(args.func(args))
    except ManifestError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="finetune", description="FineTuneJob tools (no cluster needed).")
    parser.add_argument("--version", action="version",
                        version=f"finetune {__version__} (TrainingArguments of transformers {TRANSFORMERS_VERSION})")
    sub = parser.add_subparsers(required=True, metavar="COMMAND")
    v = sub.add_parser("validate", help="check FineTuneJob files; print every error with its field path and fix")
    v.add_argument("files", nargs="+", metavar="FILE", help=f"YAML files; {STDIN} reads standard input")
    v.add_argument("-o", "--output", choices=OUTPUT_FORMATS, default="text",
                   help="text (default), or one json/yaml document listing each job's result")
    v.add_argument("--runtime", action="append", default=[], metavar="FILE", help=RUNTIME_HELP)
    v.add_argument("--model-config", metavar="FILE", help=MODEL_CONFIG_HELP)
    v.set_defaults(func=_validate)
    r = sub.add_parser("render", help="print every child object of a FineTuneJob (like `helm template`)")
    r.add_argument("file", metavar="FILE", help=f"a YAML file; {STDIN} reads standard input")
    r.add_argument("-n", "--namespace", default="default", help="namespace when the manifest has none")
    r.add_argument("--attempt", type=int, default=1, help="attempt number to render (gang restarts)")
    r.add_argument("--image", default=DEFAULT_TRAINER_IMAGE, help="default trainer image")
    r.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml",
                   help="a YAML stream (default), or a JSON List as `kubectl get -o json` prints")
    r.add_argument("--runtime", action="append", default=[], metavar="FILE", help=RUNTIME_HELP)
    r.add_argument("--model-config", metavar="FILE", help=MODEL_CONFIG_HELP + "; printed to standard error")
    r.set_defaults(func=_render)
    run = sub.add_parser("run", help="run a FineTuneJob on this machine (processes instead of pods)")
    run.add_argument("file", metavar="FILE")
    run.add_argument("--output", type=Path, help="run directory (default: runs/<job name>)")
    run.add_argument("--set", action="append", default=[], metavar="PATH=VALUE", dest="overrides",
                     help="override a field, e.g. --set spec.model.name=/models/llama (VALUE is YAML)")
    run.add_argument("--port", type=int, help="rendezvous port on 127.0.0.1 (default: a free one)")
    run.add_argument("--runtime", action="append", default=[], metavar="FILE", help=RUNTIME_HELP)
    run.add_argument("--take-over", action="store_true",
                     help="with spec.output.uri: take the prefix over from the run that writes it now (that run "
                     "stops at its next checkpoint); without it, a second writer is refused")
    run.set_defaults(func=_run)
    c = sub.add_parser("crd", help="print the CustomResourceDefinitions (FineTuneJob and the runtimes)")
    c.set_defaults(func=_crd)
    return parser


def _validate(args: argparse.Namespace) -> int:
    status = EXIT_OK
    results = []
    for path in args.files:
        for doc in load_documents(path):
            name = (doc.get("metadata") or {}).get("name", "?")
            try:
                job = validate_with_runtimes(doc, args.runtime)
            except InvalidSpec as exc:
                status = EXIT_INVALID
                results.append({"file": path, "name": name, "valid": False,
                                "errors": [_error_record(e) for e in exc.errors]})
                if args.output == "text":
                    print(f"{path}: {name}: INVALID\n{exc.summary()}", file=sys.stderr)
                continue
            verdict, why = memory_verdict(job.spec, args.model_config)
            memory = {"memoryEstimate": verdict.to_status()} if verdict else {}
            fits = verdict is None or verdict.fits
            if not fits and status == EXIT_OK:
                status = EXIT_DOES_NOT_FIT
            results.append({"file": path, "name": job.name, "valid": True, "fits": fits if verdict else None,
                            **summary(job), **memory})
            if args.output == "text":
                verdict_line = "valid" if fits else "valid, but DOES NOT FIT"
                print(f"{path}: {job.name}: {verdict_line}\n{describe(job)}\n"
                      f"{memory_text(verdict) if verdict else why}")
    if args.output != "text":
        sys.stdout.write(_dump({"results": results}, args.output))
    return status


def validate_with_runtimes(doc: dict[str, Any], runtime_files: list[str], default_namespace: str = "default"
                           ) -> ValidatedJob:
    """validate_job over the runtimes given (none: the job as written); every error at once."""
    if not runtime_files:
        return validate_job(doc, default_namespace=default_namespace)
    runtimes = [r for path in runtime_files for r in load_documents(path)]
    if not (doc.get("metadata") or {}).get("namespace"):
        doc = {**doc, "metadata": {**(doc.get("metadata") or {}), "namespace": default_namespace}}
    resolved = resolve_offline(doc, runtimes)
    if resolved.missing is not None:
        raise InvalidSpec([FieldError("spec.runtimeRef", (doc.get("spec") or {}).get("runtimeRef"), resolved.missing,
                                      "pass the runtime's file with --runtime")])
    try:
        job = validate_job(resolved.obj, default_namespace=default_namespace)
    except InvalidSpec as exc:
        raise InvalidSpec(resolved.errors + exc.errors) from None
    if resolved.errors:
        raise InvalidSpec(resolved.errors)
    return job


def _error_record(error: Any) -> dict[str, Any]:
    scalar = error.value is None or isinstance(error.value, str | int | float | bool)
    return {"path": error.path, "value": error.value if scalar else error.value_text(), "message": error.message,
            "fix": error.fix}


def summary(job: ValidatedJob) -> dict[str, Any]:
    """What the job will do, as data: the numbers `describe` prints."""
    s, d, t = job.spec, job.spec.distributed, job.spec.training
    return {
        "namespace": job.namespace, "model": s.model.name, "method": s.method.type, "nodes": d.num_nodes,
        "gpusPerNode": d.gpus_per_node, "processes": d.world_size, "strategy": _strategy(job),
        "globalBatchSize": s.global_batch_size, "perDeviceTrainBatchSize": t.per_device_train_batch_size,
        "gradientAccumulationSteps": t.gradient_accumulation_steps, "warnings": list(job.warnings),
    }


def describe(job: ValidatedJob, local: bool = False) -> str:
    """What the job will do, in the numbers users get wrong most often: processes and global batch size."""
    s, d, t = job.spec, job.spec.distributed, job.spec.training
    device = f"{d.gpus_per_node} GPU(s)" if d.gpus_per_node else f"{d.cpu_processes_per_node} CPU process(es)"
    lines = [
        f"  model:      {s.model.name} ({s.method.type}"
        + (f", {s.method.objective} on {_objective_data(job)}" if s.method.objective != "sft" else "") + ")",
        f"  topology:   {d.num_nodes} node(s) x {device} = {d.world_size} process(es), {_strategy(job)}",
        f"  batch:      global batch size {s.global_batch_size} = {t.per_device_train_batch_size} per device x "
        f"{t.gradient_accumulation_steps} accumulation x {d.world_size} process(es)",
        f"  tracking:   {', '.join(s.tracking.trackers)}",
    ]
    if d.elastic:
        sizes = ", ".join(f"{accumulation_steps(s, n * d.processes_per_node)} on {n}"
                          for n in range(d.fewest_nodes, d.num_nodes))
        lines.insert(2, f"  elastic:    {d.fewest_nodes} to {d.num_nodes} node(s); the global batch stays, with "
                        f"accumulation {sizes} node(s)")
    limit = in_place_restart_limit(s)
    if limit:
        lines.append(f"  restarts:   a failed worker restarts on its pod (at most {limit} times per pod), a lost pod "
                     "is replaced alone")
    if s.output.uri is not None:
        lines.append(f"  output:     {s.output.uri} (checkpoints uploaded as they are saved; resumes from there)")
    if s.output.push is not None:
        p = s.output.push
        when = "at the end" + (" and every checkpoint" if p.strategy == "checkpoint" else "")
        lines.append(f"  push:       {p.repo} ({'private' if p.private else 'public'}, {when})")
    lines += [f"  warning:    {w}" for w in (advice(job.spec, pods=False) if local else job.warnings)]
    return "\n".join(lines)


def _objective_data(job: ValidatedJob) -> str:
    objective, data = job.spec.method.objective, job.spec.data.format
    if objective == "kto" and data == "preference":
        return "pairs, each one desirable and one undesirable example"
    if objective == "reward":
        return "pairs: a reward model, the base with a one-output score head"
    if objective == "grpo" and job.spec.method.grpo is not None:
        g = job.spec.method.grpo
        return (f"{data} rows as prompts, {g.num_generations} completions each, rewards "
                + ", ".join(f"{r.default_name} x{r.weight:g}" for r in g.rewards))
    return {"preference": "pairs", "unpaired": "labelled examples"}.get(data, data) + (
        ", no reference model" if objective in ("orpo", "simpo", "cpo") else "")


def _strategy(job: ValidatedJob) -> str:
    d = job.spec.distributed
    if d.strategy == "deepspeed" and d.deepspeed is not None:
        return f"{d.strategy} ZeRO-{d.deepspeed.zero_stage}"
    return d.strategy


def _render(args: argparse.Namespace) -> int:
    status = EXIT_OK
    objects: list[dict[str, Any]] = []
    for doc in load_documents(args.file):
        try:
            job = validate_with_runtimes(doc, args.runtime, default_namespace=args.namespace)
        except InvalidSpec as exc:
            print(exc.summary(), file=sys.stderr)
            status = EXIT_INVALID
            continue
        ctx = RenderContext(name=job.name, namespace=job.namespace, attempt=args.attempt,
                            trainer_image=args.image, job_labels=job.labels)
        for obj in render_trainer_identity(job.namespace, job.spec.pod.service_account_name):
            if obj not in objects:  # shared by every job of the namespace: once in the stream
                objects.append(obj)
        objects += render_all(job.spec, ctx)
        verdict, why = memory_verdict(job.spec, args.model_config)
        if verdict is not None or args.model_config:
            # Rendered all the same (render is for looking at the objects); `finetune validate` is the gate.
            label = "DOES NOT FIT: " if verdict is not None and not verdict.fits else ""
            print(f"{job.name}: {label}{memory_text(verdict) if verdict else why}", file=sys.stderr)
    if args.output == "json":
        sys.stdout.write(_dump({"apiVersion": "v1", "kind": "List", "items": objects}, "json"))
    else:
        sys.stdout.write(dump_documents(objects))
    return status


def _dump(doc: dict[str, Any], output: str) -> str:
    if output == "json":
        return json.dumps(doc, indent=2, default=str) + "\n"
    return dump_documents([doc]).removeprefix("---\n")


def apply_overrides(doc: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """--set a.b.c=VALUE, VALUE parsed as YAML (so numbers and booleans keep their type)."""
    doc = copy.deepcopy(doc)
    for item in overrides:
        path, sep, value = item.partition("=")
        if not sep or not path:
            raise ManifestError(f"--set {item!r}: expected PATH=VALUE, e.g. spec.training.maxSteps=100")
        node = doc
        *parents, leaf = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ManifestError(f"--set {item!r}: {part} is not a mapping")
        node[leaf] = load_yaml(value)
    return doc


def _run(args: argparse.Namespace) -> int:
    from . import local_run

    docs = load_documents(args.file)
    if len(docs) != 1:
        raise ManifestError(f"{args.file}: finetune run takes one FineTuneJob, found {len(docs)} documents")
    try:
        job = validate_with_runtimes(apply_overrides(docs[0], args.overrides), args.runtime,
                                     default_namespace="local")
    except InvalidSpec as exc:
        print(exc.summary(), file=sys.stderr)
        return EXIT_RUN_INVALID
    print(describe(job, local=True))
    return local_run.run(job, args.output or Path("runs") / job.name, port=args.port, take_over=args.take_over)


def _crd(args: argparse.Namespace) -> int:
    sys.stdout.write(all_crds_yaml())
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
