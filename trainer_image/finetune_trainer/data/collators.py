"""Batching: pad to the longest sample (labels padded with -100), or padding-free packing."""

from typing import Any

from finetune_trainer.data import IGNORE_INDEX
from finetune_trainer.errors import ConfigError

# Attention kernels that respect per-sample position_ids in a flattened batch, so packed samples never attend
# across boundaries: flash attention reads cu_seqlens; sdpa/eager/flex get a block-diagonal mask from transformers'
# packed-sequence detection, which needs use_cache=False (load_model sets it; verified by the packed-vs-unpacked
# logits test).
PACKING_ATTENTION = ("flash_attention_2", "flash_attention_3", "sdpa", "eager", "flex_attention")


def make_collator(tokenizer, packing: bool, attn_implementation: str) -> Any:
    from transformers import DataCollatorForSeq2Seq, DataCollatorWithFlattening

    if packing:
        if attn_implementation not in PACKING_ATTENTION:
            raise ConfigError(f"packing is not supported with attention {attn_implementation}")
        return DataCollatorWithFlattening(return_position_ids=True, separator_id=IGNORE_INDEX)
    return DataCollatorForSeq2Seq(tokenizer, padding=True, pad_to_multiple_of=8, label_pad_token_id=IGNORE_INDEX,
                                  return_tensors="pt")
