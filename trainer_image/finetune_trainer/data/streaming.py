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
from finetune_trainer.data import (
    Part,
    PreparedData,
    RowEncoder,
    TokenizeStats,
    load_rows,
    sft_example,
    text_blocks,
    tokenize_documents,
)

# Examples shuffled within this window (re-seeded every epoch by the Trainer's set_epoch); shard order is shuffled too.
SHUFFLE_BUFFER = 10_000
# What the rows this process streamed gave (cut, dropped, folded), per split and group of shards: a group read again
# (the next epoch) starts its count again, so a row read twice is counted once. Said once training is over.
SEEN: dict[tuple[str, tuple[int, ...]], TokenizeStats] = {}


def tokenized_examples(parts: list[Part], data: DataSpec, tokenizer: Any, split: str = "train"
                       ) -> Iterator[dict[str, list[int]]]:
    """The examples of some shards of the row stream; the same tokenization as the cached (non-streaming) path."""
    stats = SEEN[(split, tuple(id(part.rows) for part in parts))] = TokenizeStats()
    if data.format == "text":
        for part in parts:
            yield from text_blocks(tokenize_documents(part, data, tokenizer), data.block_size or data.max_length,
                                   stats)
        return
    encoder = RowEncoder.build(data, tokenizer)
    for part in parts:
        for index, row in enumerate(part.rows):
            example = sft_example(row, encoder, stats, where=f"{part.name}, row {index + 1}")
            if example is not None:
                yield example


def tokenized_stream(parts: list[Part], data: DataSpec, tokenizer: Any, split: str = "train"):
    """An IterableDataset of token ids and labels with one shard per shard of every part."""
    import datasets

    shards = [Part(part.name, part.rows.shard(num_shards=part.rows.n_shards, index=i))
              for part in parts for i in range(part.rows.n_shards)]
    return datasets.IterableDataset.from_generator(
        tokenized_examples, gen_kwargs={"parts": shards, "data": data, "tokenizer": tokenizer, "split": split})


def streamed_stats() -> dict[str, dict[str, Any]]:
    """The counts of the rows this process streamed, per split (TokenizeStats.as_dict), summed over its shards."""
    total: dict[str, dict[str, Any]] = {}
    for (split, _), stats in SEEN.items():
        add(total.setdefault(split, {}), stats.as_dict())
    return total


def add(total: dict[str, Any], counts: dict[str, Any]) -> dict[str, Any]:
    """Counts added into `total` (the longest row is a maximum, the first example the first one seen)."""
    for key, value in counts.items():
        if key == "first":
            for outcome, where in value.items():
                total.setdefault("first", {}).setdefault(outcome, where)
            total.setdefault("first", {})
        elif key == "longest":
            total[key] = max(total.get(key, 0), value)
        else:
            total[key] = total.get(key, 0) + value
    return total


def _limited(parts: list[Part], limit: int | None) -> list[Part]:
    return parts if limit is None else [Part(p.name, p.rows.take(limit)) for p in parts]


def prepare_streaming(data: DataSpec, tokenizer: Any, seed: int) -> PreparedData:
    train_parts = load_rows(data.train, data, streaming=True)
    if data.max_train_samples is not None and len(train_parts) == 1:
        train_parts = _limited(train_parts, data.max_train_samples)
    train = tokenized_stream(train_parts, data, tokenizer)
    shards = train.n_shards
    if data.max_train_samples is not None and len(train_parts) > 1:
        train = train.take(data.max_train_samples)
    train = train.shuffle(seed=seed, buffer_size=SHUFFLE_BUFFER)
    evaluation = None
    if data.validation:
        evaluation = tokenized_stream(_limited(load_rows(data.validation, data, streaming=True),
                                                  data.max_eval_samples), data, tokenizer, "eval")
    return PreparedData(train, evaluation, {"streaming": {"trainShards": shards}})
