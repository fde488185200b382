"""Model and tokenizer from a hub id or a path, and the fine-tuning method applied to the model."""

from pathlib import Path
from typing import Any

from finetune_operator.api.spec import FineTuneJobSpec
from finetune_trainer.errors import ConfigError

DTYPES = {"bfloat16": "bfloat16", "float16": "float16", "float32": "float32", "auto": "auto"}


def load_tokenizer(spec: FineTuneJobSpec):
    m = spec.model
    # A tokenizer is configs and vocabulary files: an s3:// model's weights are not fetched for it.
    name = source(m.tokenizer, "spec.model.tokenizer", configs_only=True) or source(m.name, configs_only=True)
    no_vocabulary(name, "spec.model.tokenizer" if m.tokenizer else "spec.model.name", m.tokenizer or m.name)
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(name, revision=_revision(name, m.revision),
                                                  trust_remote_code=m.trust_remote_code)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot load the tokenizer of {m.tokenizer or m.name}: {exc}") from exc
    if tokenizer.pad_token is None:
        # Safe only because padding is masked by the attention mask and labels, never by token id: the real EOS
        # keeps its label, so the model still learns to stop.
        tokenizer.pad_token = tokenizer.eos_token
    if tokenizer.chat_template is None and spec.data.format in ("sharegpt", "messages", "preference", "unpaired",
                                                                "prompt"):
        # Conversations need a template: ours (ChatML turns closed by the real EOS) is set on the tokenizer, so
        # final/ carries the template the model was trained with and inference renders the same text.
        from finetune_trainer.data.chat import DEFAULT_CHAT_TEMPLATE

        tokenizer.chat_template = DEFAULT_CHAT_TEMPLATE
    return tokenizer


# The files a tokenizer's vocabulary lives in (fast, SentencePiece, WordPiece/BPE, tiktoken); tokenizer_config.json
# alone is not one: transformers then tries to convert a slow tokenizer and fails with advice about packages.
VOCABULARY_FILES = ("tokenizer.json", "tokenizer.model", "spiece.model", "sentencepiece.bpe.model", "vocab.json",
                    "vocab.txt", "tiktoken.model", "*.tiktoken", "qwen.tiktoken")


def no_vocabulary(directory: str | None, field: str, given: str | None) -> None:
    """A local model folder copied without its tokenizer files is said at once, with the fix."""
    if directory is None or not Path(directory).is_dir():
        return
    if any(next(Path(directory).glob(pattern), None) is not None for pattern in VOCABULARY_FILES):
        return
    raise ConfigError(f"{field}: {given} has no tokenizer files (none of {', '.join(VOCABULARY_FILES[:6])}, ...): "
                      "copy them from where the model came from (its Hub repository has them) into the folder, or "
                      "set spec.model.tokenizer to a folder or Hub id that has them")


def source(name: str | None, field: str = "spec.model.name", configs_only: bool = False) -> str | None:
    """Where from_pretrained reads a model, tokenizer or adapter (model_staging.local_source: s3:// staged here)."""
    from finetune_trainer.model_staging import local_source

    return local_source(name, field, configs_only)


def _revision(name: str | None, revision: str | None) -> str | None:
    """A Hub revision means nothing for a staged or mounted copy."""
    return None if name is not None and Path(name).is_dir() else revision


def check_lengths(spec: FineTuneJobSpec, model_config: Any) -> None:
    """A sequence longer than the model's positions trains garbage (or fails on the first long batch)."""
    limit = getattr(model_config, "max_position_embeddings", None)
    data = spec.data
    field, length = ("spec.data.blockSize", data.block_size or data.max_length) if data.format == "text" else (
        "spec.data.maxLength", data.max_length)
    if data.format == "text" and data.block_size is None:
        field = "spec.data.maxLength (the text block size when blockSize is unset)"
    if isinstance(limit, int) and length > limit:
        raise ConfigError(f"{field} is {length} but {spec.model.name} has max_position_embeddings {limit}; "
                          f"use at most {limit}")


# The packages each attention kernel needs beyond torch; the trainer image ships none of them (flash-attn builds
# for an hour against one CUDA and torch version), so a spec asking for one fails at once with the way out.
ATTENTION_PACKAGES = {"flash_attention_2": "flash_attn", "flash_attention_3": "flash_attn_interface"}


def check_attention(spec: FineTuneJobSpec) -> None:
    import importlib.util

    kernel = spec.model.attn_implementation
    package = ATTENTION_PACKAGES.get(kernel)
    if package is not None and importlib.util.find_spec(package) is None:
        raise ConfigError(f"spec.model.attnImplementation is {kernel}, but this image has no {package} package; "
                          f"use sdpa (PyTorch's fused attention, packing stays exact), or build an image FROM the "
                          f"trainer image with flash-attn installed for its torch and CUDA versions")


def quantization_config(spec: FineTuneJobSpec, use_cpu: bool):
    quant = spec.model.quantization
    if quant == "none":
        return None
    if use_cpu:
        raise ConfigError(f"model.quantization {quant} needs a GPU (bitsandbytes); request distributed.gpusPerNode")
    import torch
    from transformers import BitsAndBytesConfig

    compute = torch.bfloat16 if spec.training.precision == "bf16" else torch.float16
    if quant == "8bit":
        return BitsAndBytesConfig(load_in_8bit=True)
    # quant_storage matches the compute dtype so FSDP can shard the 4-bit weights (QLoRA + FSDP).
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                              bnb_4bit_compute_dtype=compute, bnb_4bit_quant_storage=compute)


def model_class(spec: FineTuneJobSpec) -> tuple[Any, dict[str, Any]]:
    """The transformers class a job trains, and its extra from_pretrained arguments: a reward model is the base
    with a one-output sequence-classification head (a new, seeded layer: `score` or `classifier`), the rest the
    causal LM."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    if spec.method.objective == "reward":
        return AutoModelForSequenceClassification, {"num_labels": 1}
    return AutoModelForCausalLM, {}


# The new head of a sequence-classification model, by the names transformers' architectures give it (as peft's).
SCORE_HEADS = ("score", "classifier")


def load_model(spec: FineTuneJobSpec, use_cpu: bool, vocab_size: int | None = None):
    m = spec.model
    check_attention(spec)
    cls, extra = model_class(spec)
    kwargs: dict[str, Any] = {"revision": m.revision, "trust_remote_code": m.trust_remote_code,
                              "attn_implementation": m.attn_implementation, "dtype": DTYPES[m.dtype], **extra}
    quant = quantization_config(spec, use_cpu)
    if quant is not None:
        kwargs["quantization_config"] = quant
    name = source(m.name)
    kwargs["revision"] = _revision(name, m.revision)
    try:
        model = cls.from_pretrained(name, **kwargs)
    except (OSError, ValueError, ImportError) as exc:
        raise ConfigError(f"cannot load model {m.name}: {exc}") from exc
    check_lengths(spec, model.config)
    model.config.use_cache = False  # the KV cache is useless in training and breaks gradient checkpointing
    grown = resize_embeddings(model, vocab_size)
    return apply_method(model, spec, train_embeddings=grown)


def resize_embeddings(model, vocab_size: int | None) -> bool:
    """A tokenizer with tokens the model lacks (an extended vocabulary, added special tokens): the embedding and
    head grow to it, the new rows initialised to the mean of the old ones (not random: a random row makes the
    first steps' loss explode). True when they grew."""
    rows = model.get_input_embeddings().num_embeddings
    if vocab_size is None or vocab_size <= rows:
        return False
    model.resize_token_embeddings(vocab_size, mean_resizing=True)
    return True


def embedding_module_names(model) -> list[str]:
    """The names (last component) of the input embedding and the output head, whatever the architecture calls them."""
    wanted = {id(model.get_input_embeddings()), id(model.get_output_embeddings())}
    return sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules() if id(module) in wanted})


def apply_method(model, spec: FineTuneJobSpec, train_embeddings: bool = False):
    method = spec.method
    if method.type == "full":
        return model
    if method.type == "freeze":
        extra = [*method.freeze.extra_trainable_modules, *(embedding_module_names(model) if train_embeddings else [])]
        heads = SCORE_HEADS if spec.method.objective == "reward" else ()  # the new head is always trained
        return _freeze_all_but_last_layers(model, method.freeze.trainable_layers, extra, heads)
    from peft import prepare_model_for_kbit_training

    if method.type == "qlora":
        model = prepare_model_for_kbit_training(
            model, use_gradient_checkpointing=spec.training.gradient_checkpointing,
            gradient_checkpointing_kwargs={"use_reentrant": False})
    model = _continue_adapter(model, spec) if method.lora.init_from is not None else _new_adapter(
        model, spec, train_embeddings)
    if spec.training.gradient_checkpointing:
        model.enable_input_require_grads()  # frozen embeddings would otherwise cut the graph under checkpointing
    return model


def _new_adapter(model, spec: FineTuneJobSpec, train_embeddings: bool):
    from peft import LoraConfig, get_peft_model

    lora = spec.method.lora
    targets = "all-linear" if lora.target_modules == ["all-linear"] else list(lora.target_modules)
    # New tokens' rows must be trained and saved with the adapter, or the adapter's model cannot use them.
    to_save = list(dict.fromkeys([*lora.modules_to_save, *(embedding_module_names(model) if train_embeddings else [])]))
    config = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=targets,
                        modules_to_save=to_save or None, use_rslora=lora.use_rslora,
                        use_dora=lora.use_dora, task_type=peft_task(spec))
    try:
        return get_peft_model(model, config)
    except ValueError as exc:
        raise ConfigError(f"LoRA cannot be applied ({exc}); check method.lora.targetModules") from exc


def peft_task(spec: FineTuneJobSpec) -> str:
    """SEQ_CLS makes peft train and save the reward model's new head with the adapter (modules_to_save)."""
    return "SEQ_CLS" if spec.method.objective == "reward" else "CAUSAL_LM"


def _continue_adapter(model, spec: FineTuneJobSpec):
    """method.lora.initFrom: the adapter's own config and weights, trainable, on this base model."""
    from peft import PeftModel

    adapter = source(spec.method.lora.init_from, "spec.method.lora.initFrom")
    try:
        return PeftModel.from_pretrained(model, adapter, is_trainable=True)
    except (OSError, ValueError, RuntimeError, KeyError) as exc:
        # A size mismatch (an adapter of another base model) is a RuntimeError: permanent, like a missing path.
        raise ConfigError(f"spec.method.lora.initFrom {spec.method.lora.init_from} cannot be loaded onto "
                          f"{spec.model.name}: "
                          f"{str(exc).splitlines()[0][:400]}; give a directory or Hub id with adapter_config.json "
                          "made for this base model") from exc


def _freeze_all_but_last_layers(model, n: int, extra: list[str], heads: tuple[str, ...] = ()):
    layers = _decoder_layers(model)
    if layers is None:
        raise ConfigError("method freeze needs a model with a list of decoder layers (model.layers)")
    keep = {id(p) for layer in layers[-n:] for p in layer.parameters()}
    for name, param in model.named_parameters():
        param.requires_grad = (id(param) in keep or any(e in name for e in extra)
                               or name.split(".", 1)[0] in heads)
    return model


def _decoder_layers(model):
    base = getattr(model, "model", None)
    return getattr(base, "layers", None) if base is not None else None


def trainable_parameters(model) -> tuple[int, int]:
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return trainable, sum(p.numel() for p in model.parameters())


def trained_stop_ids(spec: FineTuneJobSpec, tokenizer) -> list[int]:
    """The token ids that end a reply as the data trained them: the chat template's end-of-turn token (Phi-3's
    <|end|>, Llama-3's <|eot_id|>, GPT-OSS's <|return|>, GLM's <|user|>) and the EOS; none for raw text."""
    from finetune_trainer.data import uses_chat_template

    if spec.data.format == "text":
        return []
    stops = [tokenizer.eos_token] if tokenizer.eos_token else []
    if uses_chat_template(spec.data, tokenizer):
        from finetune_trainer.data.chat import ChatEncoder

        stops += ChatEncoder.for_tokenizer(tokenizer).stop_tokens()
    unknown = tokenizer.unk_token_id
    ids = [tokenizer.convert_tokens_to_ids(t) for t in stops]
    return list(dict.fromkeys(i for i in ids if isinstance(i, int) and i != unknown))


def add_stop_ids(model, stop_ids: list[int]) -> list[int]:
    """The model's generation_config stops at every trained stop as well as at its own EOS ids (kept first): a
    model trained to end replies with <|end|> whose config names only <|endoftext|> would generate past it.
    Returns the ids in the config."""
    from transformers import GenerationConfig

    config = getattr(model, "generation_config", None)
    if config is None:
        config = model.generation_config = GenerationConfig.from_model_config(model.config)
    current = config.eos_token_id
    current = [] if current is None else [current] if isinstance(current, int) else list(current)
    merged = list(dict.fromkeys([*current, *stop_ids]))
    if merged != current:
        config.eos_token_id = merged[0] if len(merged) == 1 else merged
    return merged


def base_model(model: Any) -> Any:
    """The transformers model under a peft wrapper (or the model itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model
