"""The final model: final/ (the adapter for LoRA) with its tokenizer and trained stops, and merged/ when asked."""

from pathlib import Path

from finetune_trainer.config import TrainerConfig
from finetune_trainer.errors import TrainerError
from finetune_trainer.outputs import checkpoints
from finetune_trainer.training.model import base_model


def save_final(cfg: TrainerConfig, trainer, tokenizer) -> dict[str, str]:
    """The final model (adapter for LoRA) under final/, plus merged/ when asked; weights verified non-empty; the
    generation config stops where the data taught the model to stop."""
    final = cfg.output_dir / "final"
    # Inference wants the KV cache (training turned it off): the saved config must not say use_cache: false.
    trainer.model.config.use_cache = True
    base = base_model(trainer.model)
    if trainer.is_fsdp_enabled:
        # Checkpoints may stay sharded (resume needs no gather), but Trainer.save_model writes no weights at all
        # under SHARDED_STATE_DICT (FSDP2's default): the final model is always gathered whole, as accelerate
        # documents for this switch.
        trainer.accelerator.state.fsdp_plugin.set_state_dict_type("FULL_STATE_DICT")
    trainer.save_model(str(final))  # gathers ZeRO-3 / FSDP weights (16-bit gather is set in the presets)
    paths = {"model": str(final)}
    if trainer.args.should_save:
        tokenizer.save_pretrained(final)
        if getattr(base, "generation_config", None) is not None:  # an adapter's directory has none of its own:
            base.generation_config.save_pretrained(final)  # the base's, with the trained stops (run())
        files = checkpoints.weight_files(final)
        if not files or any(f.stat().st_size == 0 for f in files):
            raise TrainerError(f"the final model in {final} has no or empty weights")
        if cfg.spec.output.merge_adapter and cfg.spec.method.type in ("lora", "qlora"):
            paths["merged"] = str(merge_adapter(cfg, final, tokenizer))
    trainer.accelerator.wait_for_everyone()
    return paths



def merge_adapter(cfg: TrainerConfig, adapter_dir: Path, tokenizer) -> Path:
    """Reloads base + adapter from disk on CPU and merges: works the same whatever sharding trained them."""
    from peft import PeftModel

    from finetune_trainer.training.model import add_stop_ids, model_class, source, trained_stop_ids

    m = cfg.spec.model
    name = source(m.name)
    cls, extra = model_class(cfg.spec)
    base = cls.from_pretrained(name, revision=m.revision if name == m.name else None,
                               trust_remote_code=m.trust_remote_code, dtype="auto", **extra)
    merged = PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()
    target = cfg.output_dir / "merged"
    merged.config.use_cache = True
    if cfg.spec.method.objective == "reward":
        # A reward model finds each sequence's last token by the pad id: without it, it scores one text at a time.
        merged.config.pad_token_id = tokenizer.pad_token_id
    else:
        add_stop_ids(merged, trained_stop_ids(cfg.spec, tokenizer))
    merged.save_pretrained(target)
    tokenizer.save_pretrained(target)  # merged/ is a whole model: AutoTokenizer must load from it too
    return target
