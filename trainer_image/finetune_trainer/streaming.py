"""data.streaming: rows are read and tokenized while training runs, never all at once (a Hub dataset too big to
download, a corpus too big to tokenize up front); nothing is cached.

Each file (or Hub shard) stays one shard of the stream: with at least as many shards as processes, accelerate gives
each process its own shards; otherwise every process reads the stream and keeps its share of each global batch.
Either way no process waits for another to tokenize, and batches are never dispatched from rank 0 (padded batches
of different lengths cannot be concatenated, a packed batch cannot be split). Format text is cut into blocks per
shard, so each shard drops its own tail (less than one block)."""

from collections.abc import Iterator
from typing import Any

from finetune_operator.api.data import DataSpec

from .data import PreparedData, TokenizeStats, load_rows, sft_example, text_blocks

# Examples shuffled within this window (re-seeded every epoch by the Trainer's set_epoch); shard order is shuffled too.
SHUFFLE_BUFFER = 10_000


def tokenized_examples(parts: list[Any], data: DataSpec, tokenizer) -> Iterator[dict[str, list[int]]]:
    """The examples of some shards of the row stream; the same tokenization as the cached (non-streaming) path."""
    stats = TokenizeStats()
    for part in parts:
        if data.format == "text":
            yield from text_blocks(part, data, tokenizer, stats)
        else:
            for row in part:
                example = sft_example(row, data, tokenizer, stats)
                if example is not None:
                    yield example


def tokenized_stream(rows: Any, data: DataSpec, tokenizer):
    """An IterableDataset of token ids and labels with one shard per shard of `rows`."""
    import datasets

    parts = [rows.shard(num_shards=rows.n_shards, index=i) for i in range(rows.n_shards)]
    return datasets.IterableDataset.from_generator(
        tokenized_examples, gen_kwargs={"parts": parts, "data": data, "tokenizer": tokenizer})


def prepare_streaming(data: DataSpec, tokenizer, seed: int) -> PreparedData:
    rows = load_rows(data.train, streaming=True)
    if data.max_train_samples is not None:
        rows = rows.take(data.max_train_samples)
    train = tokenized_stream(rows, data, tokenizer).shuffle(seed=seed, buffer_size=SHUFFLE_BUFFER)
    evaluation = None
    if data.validation:
        eval_rows = load_rows(data.validation, streaming=True)
        if data.max_eval_samples is not None:
            eval_rows = eval_rows.take(data.max_eval_samples)
        evaluation = tokenized_stream(eval_rows, data, tokenizer)
    return PreparedData(train, evaluation, {"streaming": {"trainShards": rows.n_shards}})
