"""Data: sources -> rows -> token ids with labels, tokenized once with `datasets` (batched, in
data.preprocessingWorkers processes, like transformers' run_clm.py) and cached by content hash.

Every row keeps where it came from, so a bad row is a DataError naming its file and row number (exit 65: the data
must change, retrying cannot help). loading.py reads sources, encoding.py makes one row's ids and labels,
tokenizing.py the dataset, prepared.py caches it; this module hands their names on."""

from finetune_trainer.data.encoding import (
    DROPPED_CUT,
    DROPPED_NO_TARGET,
    DROPPED_TOO_LONG,
    KEPT,
    TRUNCATED,
    RowEncoder,
    TokenizeStats,
    encode_completion,
    fit,
    fit_counted,
    sft_example,
    uses_chat_template,
)
from finetune_trainer.data.labels import IGNORE_INDEX
from finetune_trainer.data.loading import EXTENSIONS, Part, load_rows, load_source
from finetune_trainer.data.prepared import PreparedData, prepare
from finetune_trainer.data.tokenizing import cache_key, text_blocks, tokenize, tokenize_documents, tokenize_parts
from finetune_trainer.errors import DataError

__all__ = ["DROPPED_CUT", "DROPPED_NO_TARGET", "DROPPED_TOO_LONG", "EXTENSIONS", "IGNORE_INDEX", "KEPT", "TRUNCATED",
           "DataError", "Part", "PreparedData", "RowEncoder", "TokenizeStats", "cache_key", "encode_completion", "fit",
           "fit_counted", "load_rows", "load_source", "prepare", "sft_example", "text_blocks", "tokenize",
           "tokenize_documents", "tokenize_parts", "uses_chat_template"]
