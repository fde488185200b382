"""Generation samples (spec.evaluation.prompts): what the model answers, at every evaluation and at the end.

A prompt is rendered the way the training data is (the chat template's user turn and generation prompt for
conversation formats, the Alpaca prompt without a template, the raw text otherwise), so a sample shows what the
fine-tune taught. Written to samples.jsonl in the output directory, to TensorBoard as text, and kept for the
summary. With ZeRO-3 or FSDP the weights are sharded: every rank generates (synced_gpus) and rank 0 writes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from finetune_operator.api.data import DataSpec
from finetune_operator.api.evaluation import Generation
from finetune_trainer.data import formats, uses_chat_template

SAMPLES_FILE = "samples.jsonl"


def render_prompt(prompt: str, data: DataSpec, tokenizer: Any) -> str:
    if uses_chat_template(data, tokenizer):
        return tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                             add_generation_prompt=True)
    if data.format == "alpaca":
        return formats.ALPACA_PROMPT.format(instruction=prompt)
    return prompt


def generation_kwargs(generation: Generation, tokenizer: Any) -> dict[str, Any]:
    """The spec's parameters over the model's generation_config (unset ones are not passed)."""
    chosen = {"max_new_tokens": generation.max_new_tokens, "do_sample": generation.do_sample,
              "temperature": generation.temperature, "top_p": generation.top_p, "top_k": generation.top_k,
              "repetition_penalty": generation.repetition_penalty, "num_beams": generation.num_beams}
    return {**{k: v for k, v in chosen.items() if v is not None}, "pad_token_id": tokenizer.pad_token_id,
            "use_cache": True}


class SampleCallback(TrainerCallback):
    def __init__(self, prompts: list[str], generation: Generation, data: DataSpec, tokenizer: Any, output_dir: Path,
                 sharded: bool, stop: Any = None):
        self.prompts, self.tokenizer, self.sharded, self.stop = prompts, tokenizer, sharded, stop
        self.rendered = [render_prompt(p, data, tokenizer) for p in prompts]
        self.kwargs = generation_kwargs(generation, tokenizer)
        self.path = output_dir / SAMPLES_FILE
        self.last: list[dict[str, Any]] = []
        self.tensorboard: Any = None  # the Trainer's TensorBoardCallback, set by build_trainer

    def on_evaluate(self, args, state, control, model=None, **kwargs):
        self._sample(args, state, model, str(state.global_step))

    def on_train_end(self, args, state, control, model=None, **kwargs):
        if getattr(self.stop, "requested", None) is None:  # a stop's grace period is for its checkpoint
            self._sample(args, state, model, "final")

    def _sample(self, args, state, model, at: str) -> None:
        if model is None or not (self.sharded or state.is_world_process_zero):
            return
        import torch

        was_training = model.training
        model.eval()
        completions = []
        try:
            with torch.no_grad():
                for text in self.rendered:
                    # The rendered prompt already carries what the template writes (a BOS included).
                    batch = self.tokenizer(text, return_tensors="pt", add_special_tokens=False).to(model.device)
                    out = model.generate(**batch, **self.kwargs, synced_gpus=self.sharded)
                    completions.append(self.tokenizer.decode(out[0, batch["input_ids"].shape[1]:],
                                                             skip_special_tokens=True))
        finally:
            model.train(was_training)
        if not state.is_world_process_zero:
            return
        self.last = [{"step": state.global_step, "at": at, "prompt": p, "completion": c}
                     for p, c in zip(self.prompts, completions, strict=True)]
        with self.path.open("a", encoding="utf-8") as f:
            for record in self.last:
                f.write(json.dumps(record) + "\n")
        writer = getattr(self.tensorboard, "tb_writer", None)
        if writer is not None:
            for i, record in enumerate(self.last):
                writer.add_text(f"samples/{i}", f"**prompt:** {record['prompt']}\n\n**completion:** "
                                f"{record['completion']}", state.global_step)
            writer.flush()
