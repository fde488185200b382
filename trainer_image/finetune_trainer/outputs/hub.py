"""spec.output.push: the final model (adapter for LoRA), its tokenizer and chat template and a model card, pushed to
the Hugging Face Hub (or a Hub-compatible server) after they are saved. The output directory's caches never go."""

import logging
import threading
from pathlib import Path
from typing import Any

import yaml
from transformers import TrainerCallback

from finetune_trainer.config import TrainerConfig
from finetune_trainer.errors import PushFailed, PushRefused
from finetune_trainer.outputs.hub_access import ensure_repo, hub_api, with_retries

log = logging.getLogger(__name__)
# Never pushed: the Hub cache and tokenized data (.cache/), half-written files, tracker run files.
IGNORE = [".cache", ".cache/**", "**/.cache/**", "*.tmp", ".*.tmp", "wandb/**", "mlruns/**"]


def push_final(cfg: TrainerConfig, paths: dict[str, str], summary: dict[str, Any]) -> dict[str, Any]:
    """Writes the model card into final/, then pushes final/ (and merged/ to the repo's merged/). Raises
    PushRefused (permanent) or PushFailed (retryable) with where the saved model is."""
    push = cfg.spec.output.push
    final = Path(paths["model"])
    (final / "README.md").write_text(model_card(cfg, summary), encoding="utf-8")
    api = hub_api(cfg)

    def upload() -> str:
        ensure_repo(api, cfg)
        step = summary.get("steps")
        commit = api.upload_folder(repo_id=push.repo, folder_path=final, revision=push.revision,
                                   commit_message=f"{cfg.job_name}: final model, step {step}",
                                   ignore_patterns=IGNORE)
        if paths.get("merged"):
            api.upload_folder(repo_id=push.repo, folder_path=paths["merged"], path_in_repo="merged",
                              revision=push.revision, ignore_patterns=IGNORE,
                              commit_message=f"{cfg.job_name}: merged model, step {step}")
        return str(commit.commit_url if hasattr(commit, "commit_url") else commit)

    url = with_retries(upload, f"pushing {final} to {push.repo}")
    log.info("pushed %s to %s (%s)", final, push.repo, url)
    return {"pushed": {"repo": push.repo, "revision": push.revision, "commit": url}}


class CheckpointPusher:
    """strategy checkpoint: each saved checkpoint goes to last-checkpoint/ in the repository, in a background
    thread so training goes on; one push at a time (a newer checkpoint waits for the older one). A failure warns:
    the checkpoint is still on the volume."""

    def __init__(self, cfg: TrainerConfig):
        self.cfg, self.api = cfg, hub_api(cfg)
        self._thread: threading.Thread | None = None
        self.pushed: list[int] = []
        self.failures: list[str] = []

    def push(self, checkpoint: Path, step: int) -> None:
        self.wait()
        self._thread = threading.Thread(target=self._push, args=(checkpoint, step), daemon=True,
                                        name="checkpoint-push")
        self._thread.start()

    def _push(self, checkpoint: Path, step: int) -> None:
        push = self.cfg.spec.output.push
        try:
            def upload() -> str:
                ensure_repo(self.api, self.cfg)
                return str(self.api.upload_folder(
                    repo_id=push.repo, folder_path=checkpoint, path_in_repo="last-checkpoint", revision=push.revision,
                    ignore_patterns=IGNORE, commit_message=f"{self.cfg.job_name}: checkpoint, step {step}"))
            with_retries(upload, f"pushing {checkpoint} to {push.repo}/last-checkpoint")
            self.pushed.append(step)
        except (PushFailed, PushRefused) as exc:
            self.failures.append(str(exc))
            log.warning("checkpoint push failed (training goes on): %s", exc)

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()


class CheckpointPushCallback(TrainerCallback):
    def __init__(self, pusher: CheckpointPusher):
        self.pusher = pusher

    def on_save(self, args, state, control, **kwargs: Any) -> None:
        if args.should_save:
            self.pusher.push(Path(args.output_dir) / f"checkpoint-{state.global_step}", state.global_step)


def model_card(cfg: TrainerConfig, summary: dict[str, Any]) -> str:
    """README.md: Hub metadata (base model, library, tags, datasets), what was trained how, final metrics, and the
    spec sections that made it."""
    spec = cfg.spec
    adapter = spec.method.type in ("lora", "qlora")
    sources = [*spec.data.train, *([spec.data.validation] if spec.data.validation else [])]
    datasets = sorted({s.hub.name for s in sources if s.hub is not None})
    metadata: dict[str, Any] = {
        "base_model": spec.model.name, "library_name": "peft" if adapter else "transformers",
        "pipeline_tag": "text-generation", "tags": ["finetunejob", spec.method.type, spec.data.format],
        **({"datasets": datasets} if datasets else {}),
    }
    metrics = [("steps", summary.get("steps")), ("final train loss", summary.get("finalLoss")),
               ("eval loss", summary.get("evalLoss")), ("eval perplexity", summary.get("evalPerplexity")),
               ("tokens seen", summary.get("tokensSeen")), ("train runtime (s)", summary.get("trainRuntimeSeconds")),
               ("world size", summary.get("worldSize"))]
    t = spec.training
    settings = [("method", spec.method.type), ("learning rate", t.learning_rate),
                ("global batch (sequences)", spec.global_batch_size), ("precision", t.precision),
                ("max length", spec.data.max_length)]
    if adapter:
        settings += [("LoRA r / alpha", f"{spec.method.lora.r} / {spec.method.lora.alpha}")]
    trained = spec.model_dump(by_alias=True, exclude_none=True,
                              include={"model", "data", "method", "training", "evaluation"})
    usage = ("from peft import AutoPeftModelForCausalLM\n"
             f"model = AutoPeftModelForCausalLM.from_pretrained({spec.output.push.repo!r})") if adapter else (
             "from transformers import AutoModelForCausalLM\n"
             f"model = AutoModelForCausalLM.from_pretrained({spec.output.push.repo!r})")
    return "\n".join([
        "---", yaml.safe_dump(metadata, sort_keys=False).rstrip(), "---", "",
        f"# {spec.output.push.repo.split('/')[-1]}", "",
        f"{'A LoRA adapter for' if adapter else 'A fine-tune of'} `{spec.model.name}`, trained by the FineTuneJob "
        f"`{cfg.namespace}/{cfg.job_name}`.", "",
        "## Use", "", "```python", usage, "```", "",
        "## Training", "", "| setting | value |", "|---|---|",
        *(f"| {k} | {v} |" for k, v in settings), "",
        "## Results", "", "| metric | value |", "|---|---|",
        *(f"| {k} | {_fmt(v)} |" for k, v in metrics if v is not None), "",
        "## Configuration", "", "```yaml", yaml.safe_dump(trained, sort_keys=False).rstrip(), "```", "",
    ])


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
