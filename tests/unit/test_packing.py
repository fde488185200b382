"""Packing without cross-sample attention: a packed sample's logits equal the same sample run alone."""

import pytest

from finetune_operator.api.data import DataSpec
from finetune_trainer import data as D
from finetune_trainer.data.collators import make_collator

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_packed_logits_equal_unpacked(tiny_model_dir, tiny_tokenizer, attention):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation=attention, dtype="float32")
    model.eval()
    # As in training (finetune_trainer.training.model sets it): transformers only builds the packed-sequence mask when
    # there is no KV cache, so use_cache must be off for packing to be exact.
    model.config.use_cache = False
    rows = [{"instruction": "Name a primary colour.", "output": "Red."},
            {"instruction": "What is two plus two?", "output": "Four, of course."},
            {"instruction": "Hi.", "output": "Hello there."}]
    spec = DataSpec.model_validate({"format": "alpaca", "train": [{"inline": rows}]})
    examples = list(D.tokenize(rows, spec, tiny_tokenizer)[0])
    packed = make_collator(tiny_tokenizer, packing=True, attn_implementation=attention)(examples)
    assert packed["input_ids"].shape[0] == 1  # one flattened row, no padding at all
    lengths = [len(e["input_ids"]) for e in examples]
    assert packed["input_ids"].shape[1] == sum(lengths)
    with torch.no_grad():
        packed_logits = model(input_ids=packed["input_ids"], position_ids=packed["position_ids"]).logits[0]
        start = 0
        for example, length in zip(examples, lengths, strict=True):
            alone = model(input_ids=torch.tensor([example["input_ids"]])).logits[0]
            torch.testing.assert_close(packed_logits[start:start + length], alone, atol=1e-5, rtol=1e-4)
            start += length


def test_without_position_ids_samples_would_attend_across_boundaries(tiny_model_dir, tiny_tokenizer):
    """Control: the equality above is not vacuous; concatenating without per-sample positions changes logits."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation="sdpa", dtype="float32")
    a = tiny_tokenizer("Name a primary colour.", add_special_tokens=False)["input_ids"]
    b = tiny_tokenizer("What is two plus two?", add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        joined = model(input_ids=torch.tensor([a + b])).logits[0, len(a):]
        alone = model(input_ids=torch.tensor([b])).logits[0]
    assert not torch.allclose(joined, alone, atol=1e-3)
