"""Preflight: what a job needs, checked in one small CPU pod before any GPU is requested (spec.runPolicy.preflight),
or anywhere with `python -m finetune_trainer.preflight --config trainer.json`.

- the tokenizer loads, and the model's config (no weights);
- every data source is readable and its first rows give trainable examples (read as a stream: a Hub dataset or a
  large file is not downloaded whole);
- the output directory is writable; a checkpoint named in checkpoints.resume verifies;
- with output.push, the Hub repository exists or the token creates it (a refused token: exit 77);
- the model can be built as the spec asks (a MoE's fused experts take no LoRA dropout, Gemma-2 has no sdpa) and
  the predicted peak memory per GPU fits the GPU, offloaded states the pod (finetune_operator.fit): a spec that
  cannot is exit 78 with the numbers and the changes that fit.

Exit codes and the termination message follow the trainer's contract (78 config, 65 data, 77 push refused), so the
operator fails the job with the same reasons a first attempt would have, minus the GPUs it would have held.
"""

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from typing import Any

from finetune_operator.api.data import DataSource
from finetune_trainer.config import TrainerConfig, load_config
from finetune_trainer.data import (
    Part,
    RowEncoder,
    TokenizeStats,
    load_source,
    sft_example,
    text_blocks,
    tokenize_documents,
)
from finetune_trainer.errors import ConfigError, DataError, outcome
from finetune_trainer.launch import write_termination_message
from finetune_trainer.training.resume import resume_checkpoint

log = logging.getLogger("finetune_trainer.preflight")
ROWS_PER_SOURCE = 64


def check_model(cfg: TrainerConfig) -> tuple[dict[str, Any], Any, dict[str, Any]]:
    from transformers import AutoConfig

    from finetune_trainer.training.model import check_attention, check_lengths, load_tokenizer

    m = cfg.spec.model
    check_attention(cfg.spec)
    tokenizer = load_tokenizer(cfg.spec)
    from finetune_trainer.training.model import source

    name = source(m.name, configs_only=True)  # an s3:// model: its configs only, not gigabytes of weights
    try:
        config = AutoConfig.from_pretrained(name, revision=m.revision if name == m.name else None,
                                            trust_remote_code=m.trust_remote_code)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot load the model config of {m.name}: {exc}") from exc
    check_lengths(cfg.spec, config)
    return {"modelType": config.model_type, "vocabSize": len(tokenizer)}, tokenizer, config.to_dict()


def check_memory(cfg: TrainerConfig, config: dict[str, Any], tokenizer_vocab: int) -> dict[str, Any] | None:
    """What the stack cannot build for this model, and the predicted peak memory per GPU against the GPU's
    (spec.resources.gpuMemoryGiB or the product label) and offloaded states against the pod's memory: refused here
    (78) with the numbers and the changes that fit, before any GPU is held; above 90% is a warning; a GPU whose
    memory we do not know is said (the check could only report). None for a model whose config the estimate cannot
    read."""
    from finetune_operator.fit import UnknownShape, check_fit

    try:
        # The trainer grows the embedding and head to the tokenizer (resize_embeddings): counted as what will train.
        verdict = check_fit(cfg.spec, config, tokenizer_vocab=tokenizer_vocab)
    except UnknownShape as exc:
        log.warning("memory fit check skipped: %s", exc)
        return None
    log.info("%s\n%s", verdict.message(), verdict.estimate.table(verdict.capacity_gib))
    if not verdict.fits:
        raise ConfigError(f"memory: {verdict.message()}")
    if verdict.tight or not verdict.checked:
        log.warning("memory: %s", verdict.message())
    return verdict.to_status()


def _sample(source: DataSource, cfg: TrainerConfig, rows: int = ROWS_PER_SOURCE) -> list[Part]:
    return [Part(p.name, p.rows.take(rows)) for p in load_source(source, cfg.spec.data, streaming=True)]


def conversational_prompts(cfg: TrainerConfig, tokenizer) -> bool:
    """GRPO: whether any source's prompts are conversations, which makes every text prompt one user message (the
    trainer's data/prompts.py): the length check must see that form. A source's prompts have one type (the loader
    refuses a column whose type changes), so its first row says."""
    from finetune_trainer.data.prompts import prompt_row

    chat = tokenizer.chat_template is not None
    for source in [*cfg.spec.data.train, *(cfg.spec.data.validation or [])]:
        for part in _sample(source, cfg, 1):
            for row in part.rows:
                if isinstance(prompt_row(row, cfg.spec.data, chat, f"{part.name}, row 1")["prompt"], list):
                    return True
    return False


def check_source(source: DataSource, where: str, cfg: TrainerConfig, tokenizer,
                 conversation: bool = False) -> dict[str, Any]:
    """`conversation`: GRPO's prompts are conversations (conversational_prompts)."""
    data = cfg.spec.data
    parts = _sample(source, cfg)
    stats = TokenizeStats()
    if cfg.spec.method.objective == "grpo":  # prompts as the trainer checks them: lengths, reward columns
        from finetune_trainer.data.prompts import checked_prompt

        for part in parts:
            for i, row in enumerate(part.rows):
                checked_prompt(row, data, cfg.spec.method.grpo, tokenizer, f"{part.name}, row {i + 1}", conversation)
                stats.rows += 1
                stats.kept += 1
        if stats.rows == 0:
            raise DataError(f"{where} has no rows")
    elif data.format in ("preference", "unpaired"):  # the rows as the trainer checks them, prompt lengths included
        from finetune_trainer.data.preference import checked_pair
        from finetune_trainer.data.row_names import row_namer

        for part in parts:
            name = row_namer(part)
            for i, row in enumerate(part.rows):
                checked_pair(row, data, tokenizer, name(i))
                stats.rows += 1
                stats.kept += 1
        if stats.rows == 0:
            raise DataError(f"{where} has no rows")
    elif data.format == "text":
        for part in parts:
            sum(1 for _ in text_blocks(tokenize_documents(part, data, tokenizer), data.block_size or data.max_length,
                                       stats))
        if stats.rows == 0:
            raise DataError(f"{where} has no rows")
    else:
        encoder = RowEncoder.build(data, tokenizer)
        kept = sum(1 for part in parts for i, row in enumerate(part.rows)
                   if sft_example(row, encoder, stats, where=f"{part.name}, row {i + 1}") is not None)
        if kept == 0:
            raise DataError(f"none of the first {stats.rows} rows of {where} gives a trainable example "
                            f"({stats.as_dict()}); check the format, the column mapping and maxLength")
    return {"source": where, **stats.as_dict()}


def check_output(cfg: TrainerConfig) -> None:
    try:
        cfg.output_dir.mkdir(parents=True, exist_ok=True)
        probe = cfg.output_dir / ".preflight-write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"the output directory {cfg.output_dir} is not writable: {exc}") from exc
    resume_checkpoint(cfg)  # the trainer's own choice: a checkpoint named in checkpoints.resume must verify


def run(config_path: str) -> dict[str, Any]:
    cfg = load_config(config_path)
    from finetune_trainer import objectstore

    objectstore.configure(cfg.spec.s3, cfg.model_cache)
    if cfg.spec.output.uri:  # the bucket exists and takes writes with these credentials (else 77)
        objectstore.check_bucket(cfg.spec.output.uri)
        from finetune_trainer.outputs.owner import OwnerRecord, take_over_asked, writer_of

        # No other run writes the prefix (else 78), before any GPU is asked for; the trainer claims it.
        OwnerRecord(cfg.spec.output.uri, writer_of(cfg.job_name, cfg.namespace, cfg.job_uid, cfg.output_dir),
                    take_over_asked()).check()
    model, tokenizer, model_config = check_model(cfg)
    data = cfg.spec.data
    chat = cfg.spec.method.objective == "grpo" and conversational_prompts(cfg, tokenizer)
    sources = [check_source(s, f"data.train[{i}]", cfg, tokenizer, chat) for i, s in enumerate(data.train)]
    sources += [check_source(s, f"data.validation[{i}]", cfg, tokenizer, chat)
                for i, s in enumerate(data.validation or [])]
    check_output(cfg)
    if cfg.spec.method.objective == "grpo":  # each user function imports and takes TRL's arguments (78 if not)
        from finetune_trainer.training.rewards import load_function

        for i, reward in enumerate(cfg.spec.method.grpo.rewards):
            if reward.type == "function":
                load_function(reward, i, cfg.reward_code)
    hub = {}
    if cfg.spec.output.push is not None:
        from finetune_trainer.outputs.hub_access import check_access

        hub = check_access(cfg)
    memory = check_memory(cfg, model_config, len(tokenizer))
    return {"reason": "Succeeded", "preflight": {**model, "rowsChecked": ROWS_PER_SOURCE, "sources": sources, **hub},
            **({"memoryEstimate": memory} if memory else {})}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="finetune_trainer.preflight")
    parser.add_argument("--config", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    code, summary, unexpected = outcome(lambda: run(args.config), prefix="preflight: ")
    if unexpected is not None:
        log.error("preflight failed", exc_info=unexpected)
    summary = {"exitCode": code, **summary}
    write_termination_message(summary)
    print("FINETUNE_PREFLIGHT " + json.dumps(summary, default=str), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
