"""spec.model: which base model to fine-tune and how to load it."""

from typing import Literal

from pydantic import Field

from .base import ApiModel
from .sources import LOCATION_SCHEMA, Location

Dtype = Literal["auto", "bfloat16", "float16", "float32"]
AttentionImplementation = Literal["eager", "sdpa", "flash_attention_2", "flash_attention_3", "flex_attention"]
Quantization = Literal["none", "8bit", "4bit"]


class ModelSpec(ApiModel):
    name: Location = Field(
        min_length=1,
        max_length=1024,
        json_schema_extra=LOCATION_SCHEMA,
        description="Base model: a Hugging Face Hub id (e.g. meta-llama/Llama-3.2-1B) or a directory on a mounted "
        "volume (an absolute path such as /models/llama).",
    )
    revision: str | None = Field(
        default=None, min_length=1, max_length=256, description="Hub revision (branch, tag or commit) to pin."
    )
    tokenizer: Location | None = Field(
        default=None,
        min_length=1,
        max_length=1024,
        json_schema_extra=LOCATION_SCHEMA,
        description="Tokenizer hub id or path when it differs from the model; defaults to the model's own. Tokens "
        "the model lacks (an extended vocabulary, added special tokens) grow its embedding and head, the new rows "
        "starting at the mean of the old ones; LoRA then trains and saves both (modules_to_save).",
    )
    dtype: Dtype = Field(default="auto", description="Dtype the weights are loaded in; auto uses the checkpoint's.")
    attn_implementation: AttentionImplementation = Field(
        default="sdpa",
        description="Attention kernel; flash_attention_2/3 need a GPU and the flash-attn package, which the trainer "
        "image does not ship (the trainer refuses them at start, exit 78, in an image without it). Packing is exact "
        "with each of them: batches are flattened with per-sample position ids, so samples never attend across "
        "boundaries.",
    )
    trust_remote_code: bool = Field(
        default=False, description="Run Python code shipped with the model repository. Off unless you trust it."
    )
    quantization: Quantization = Field(
        default="none", description="Load the base weights quantized with bitsandbytes (GPU only); qlora needs 4bit."
    )
