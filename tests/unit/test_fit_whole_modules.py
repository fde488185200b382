"""Modules trained whole beside what the method trains: LoRA's modulesToSave (peft trains a copy, the original stays
frozen), freeze's extraTrainableModules (trained in place), and the embedding and head a tokenizer with more tokens
grows (the trainer adds them to either). Every module a spec may name, for every method and the architectures next
to Llama (tied embeddings, MoE, a big vocabulary)."""

import json
from pathlib import Path

import pytest

from finetune_operator.api.validation import validate_job
from finetune_operator.fit import GIB, ModelShape, check_fit, estimate
from finetune_operator.fit.states import optimizer_state_bytes, trainable
from tests.builders import make_job

CONFIGS = Path(__file__).parents[2] / "tests" / "data" / "model_configs"
ARCHITECTURES = ["llama-3.1-8b", "gemma-2-9b", "qwen2.5-0.5b", "mixtral-8x7b"]


def config(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}.json").read_text())


def job(method: str, whole: list[str] | None = None, **overrides):
    block = ({"lora": {"modulesToSave": whole or []}} if method in ("lora", "qlora") else
             {"freeze": {"trainableLayers": 2, "extraTrainableModules": whole or []}} if method == "freeze" else {})
    quantized = {"spec.model.quantization": "4bit"} if method == "qlora" else {}
    return validate_job(make_job({"spec.model.name": "meta-llama/Llama-3.1-8B", "spec.model.dtype": "bfloat16",
                                  **quantized,
                                  "spec.method": {"type": method, **block}, "spec.data.maxLength": 1024,
                                  "spec.distributed.gpusPerNode": 1, **overrides})).spec


def _cases():
    for arch in ARCHITECTURES:
        shape = ModelShape.from_config(config(arch))
        for method in ("lora", "qlora", "freeze"):
            for name in shape.module_parameters():
                yield pytest.param(arch, method, name, id=f"{arch}-{method}-{name}")


@pytest.mark.parametrize(("arch", "method", "name"), list(_cases()))
def test_every_module_a_spec_may_train_whole_is_counted(arch, method, name):
    shape = ModelShape.from_config(config(arch))
    sizes = shape.module_parameters()
    base, more = job(method), job(method, [name])
    n0, n1 = trainable(base, shape)[0], trainable(more, shape)[0]
    # freeze matches parameter-name substrings: "norm" trains every norm
    added = sizes[name] if method != "freeze" else sum(v for k, v in sizes.items() if name in k)
    if method == "freeze" and shape.tied_embeddings and set(shape.embedding_names) <= {k for k in sizes if name in k}:
        added -= sizes[shape.embedding_names[1]]
    assert n1 - n0 == min(added, shape.parameters - n0)
    copy = 4.0 if method == "qlora" else 2.0  # QLoRA upcasts what bitsandbytes leaves to fp32
    e0, e1 = estimate(base, shape), estimate(more, shape)
    grads = e1.terms["gradients"] - e0.terms["gradients"]
    states = e1.terms["optimizer states"] - e0.terms["optimizer states"]
    weights = e1.terms["weights"] - e0.terms["weights"]
    if method == "freeze":  # in place: the weights are the same bytes, now with gradients and states
        assert weights == pytest.approx(0, abs=1)
        assert grads == pytest.approx((n1 - n0) * 2.0)
    else:  # a copy beside the frozen original
        assert weights == pytest.approx(added * copy) and grads == pytest.approx(added * copy)
    assert states == pytest.approx((n1 - n0) * optimizer_state_bytes(more.training.optim, 2.0 if method == "freeze"
                                                                      else copy))
    assert not any("not counted" in n for n in e1.notes)


def test_the_embedding_and_head_of_an_8b_model_add_what_lora_alone_does_not_count():
    """The review's case: Llama-3.1-8B LoRA with modulesToSave [embed_tokens, lm_head]: two bf16 copies of 128256 x
    4096, their gradients and AdamW's two states: 8 bytes x 1.05 B parameters, 7.8 GiB."""
    shape = ModelShape.from_config(config("llama-3.1-8b"))
    plain, whole = estimate(job("lora"), shape), estimate(job("lora", ["embed_tokens", "lm_head"]), shape)
    added = sum(whole.terms[t] - plain.terms[t] for t in ("weights", "gradients", "optimizer states"))
    assert added / GIB == pytest.approx(2 * 128256 * 4096 * 8 / GIB)
    assert round(added / GIB, 1) == 7.8


@pytest.mark.parametrize("method", ["lora", "qlora", "freeze"])
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_a_tokenizer_that_grows_the_vocabulary_trains_the_embedding_and_head(arch, method):
    """The trainer grows the embedding and head to the tokenizer and trains them: the same as naming both, at the
    grown size; a tokenizer no larger than the model grows nothing."""
    cfg = config(arch)
    shape = ModelShape.from_config(cfg)
    embedding, head = shape.embedding_names
    grown = check_fit(job(method), cfg, tokenizer_vocab=shape.vocab + 1000)
    named = check_fit(job(method, [embedding, head]), {**cfg, "vocab_size": shape.vocab + 1000})
    assert grown.estimate.terms == named.estimate.terms
    assert any("grows the embedding and head" in n for n in grown.estimate.notes)
    for same in (shape.vocab, shape.vocab - 10, None):
        assert check_fit(job(method), cfg, tokenizer_vocab=same).estimate.terms == \
            check_fit(job(method), cfg).estimate.terms


def test_tied_weights_train_once_in_place_and_twice_as_copies():
    cfg = config("qwen2.5-0.5b")
    shape = ModelShape.from_config(cfg)
    assert shape.tied_embeddings
    both = list(shape.embedding_names)
    assert trainable(job("freeze", both), shape)[0] - trainable(job("freeze"), shape)[0] == shape.vocab * shape.hidden
    assert trainable(job("lora", both), shape)[0] - trainable(job("lora"), shape)[0] == 2 * shape.vocab * shape.hidden
    untied = ModelShape.from_config({**cfg, "tie_word_embeddings": False})
    assert trainable(job("freeze", both), untied)[0] - trainable(job("freeze"), untied)[0] == \
        2 * shape.vocab * shape.hidden


@pytest.mark.parametrize(("method", "name"), [
    ("lora", "vision_tower"), ("lora", "mlp"), ("lora", "layers"), ("freeze", "weight"), ("freeze", "mlp"),
    ("freeze", "layers.0"), ("freeze", "experts"), ("freeze", "vision_tower")])
def test_a_module_we_cannot_size_makes_no_fits_verdict(method, name):
    """A review: freeze ["weight"] trains every parameter (the trainer matches substrings of full parameter names)
    and was "fits, 20.9 GiB" on a 40 GiB GPU for an 8B model a full fine-tune of which needs 66; LoRA ["mlp"] copies
    every MLP (peft matches name endings). A name we cannot size is said, and the verdict is "not checked"."""
    cfg = config("mixtral-8x7b" if name == "experts" else "llama-3.1-8b")
    verdict = check_fit(job(method, [name], **{"spec.resources.gpuMemoryGiB": 141}), cfg)
    field = "lora.modulesToSave" if method == "lora" else "freeze.extraTrainableModules"
    assert verdict.estimate.uncounted == [f"method.{field} {name} (no module of that name we can size)"]
    assert not verdict.checked and "not checked, the job may need more" in verdict.message()
    sized = check_fit(job(method, ["lm_head"], **{"spec.resources.gpuMemoryGiB": 141}), cfg)
    assert sized.checked and sized.estimate.uncounted == []


def test_a_continued_adapter_says_what_it_does_not_read():
    shape = ModelShape.from_config(config("llama-3.1-8b"))
    grown = ModelShape(**{**shape.__dict__, "vocab": shape.vocab + 8, "embeddings_grown": True})
    est = estimate(job("lora", **{"spec.method.lora.initFrom": "/models/adapter"}), grown)
    assert any("initFrom: the continued adapter's own modules_to_save and DoRA are not read" in n for n in est.notes)
    assert not any("which then train" in n for n in est.notes)  # _continue_adapter adds no modules_to_save
