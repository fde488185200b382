"""Preference data, in the layouts TRL's trainers read (TRL applies the chat template to conversations and
tokenizes): pairs (data.format preference: prompt, chosen, rejected; or LLaMA-Factory's alpaca and sharegpt pair
layouts) and unpaired examples (data.format unpaired: prompt, completion, label; KTO), as text or as conversations
(lists of role/content messages). Every row is checked before training, with the file and line (JSON Lines) or row
of a bad one (exit 65): a missing or empty answer, an answer that is not text or assistant messages, chosen and
rejected the same, a label that is not a yes or a no (data/preference_rows.py), and a prompt that leaves no room for
an answer within data.maxLength, which TRL would drop without a word."""

from collections.abc import Callable
from typing import Any

from finetune_operator.api.data import DataSpec
from finetune_trainer.data.loading import Part, load_rows
from finetune_trainer.data.preference_rows import preference_row, unpaired_row
from finetune_trainer.data.prepared import PreparedData
from finetune_trainer.data.row_names import row_namer
from finetune_trainer.errors import ConfigError, DataError

LENGTH_BATCH = 256  # rows rendered and tokenized at once for the prompt-length check


def _common_prefix(a: list[int], b: list[int]) -> int:
    n, limit = 0, min(len(a), len(b))
    while n < limit and a[n] == b[n]:
        n += 1
    return n


def _token_ids(tokenizer: Any, texts: list[Any], **chat: Any) -> list[list[int]]:
    """Token ids of each text or conversation, as TRL's _tokenize makes them (a conversation through the chat
    template, a text with the tokenizer's special tokens)."""
    if isinstance(texts[0], list):
        return list(tokenizer.apply_chat_template(texts, tokenize=True, return_dict=True, **chat)["input_ids"])
    return list(tokenizer(texts)["input_ids"])


def prompt_lengths(rows: list[dict[str, Any]], tokenizer: Any) -> list[int]:
    """The prompt's length in tokens as TRL's DPOTrainer and KTOTrainer count it (their tokenize_fn): the tokens
    that the prompt alone (with the generation prompt) and the prompt followed by each answer have in common. TRL
    drops a row whose prompt length is data.maxLength or more (nothing of the answer would be trained)."""
    out = [0] * len(rows)
    for kind in (False, True):  # text rows, then conversations: a batch is rendered one way
        index = [i for i, row in enumerate(rows) if isinstance(row["prompt"], list) is kind]
        if not index:
            continue
        prompts = _token_ids(tokenizer, [rows[i]["prompt"] for i in index], **({"add_generation_prompt": True}
                                                                                 if kind else {}))
        answers = [k for k in ("chosen", "rejected", "completion") if k in rows[index[0]]]
        full = [_token_ids(tokenizer, [rows[i]["prompt"] + rows[i][k] for i in index]) for k in answers]
        for j, i in enumerate(index):
            out[i] = min(_common_prefix(prompts[j], ids[j]) for ids in full)
    return out


def _checked(rows: list[dict[str, Any]], wheres: list[str], data: DataSpec, tokenizer: Any) -> None:
    """What needs the tokenizer: a chat template for conversations, room for an answer within data.maxLength."""
    for row, where in zip(rows, wheres, strict=True):
        if isinstance(row["prompt"], list) and tokenizer.chat_template is None:
            raise ConfigError(f"{where} is a conversation but the tokenizer has no chat template; set "
                              "model.tokenizer to one that has, or give the pairs as text")
    for start in range(0, len(rows), LENGTH_BATCH):
        chunk = rows[start:start + LENGTH_BATCH]
        for n, where in zip(prompt_lengths(chunk, tokenizer), wheres[start:start + LENGTH_BATCH], strict=True):
            if n >= data.max_length:
                raise DataError(f"{where}: the prompt is {n} tokens, data.maxLength is {data.max_length}: no token "
                                "of the answer would be trained (TRL would drop the row without a word); raise "
                                "data.maxLength or shorten the prompt")


def _rows(parts: list[Part], data: DataSpec, tokenizer: Any, limit: int | None) -> tuple[list[dict], int]:
    read: Callable[..., dict[str, Any]] = unpaired_row if data.format == "unpaired" else preference_row
    rows: list[dict[str, Any]] = []
    wheres: list[str] = []
    for part in parts:
        name = row_namer(part)
        for i, row in enumerate(part.rows):
            if limit is not None and len(rows) >= limit:
                break
            wheres.append(name(i))
            rows.append(read(row, data.columns, wheres[-1]))
    _checked(rows, wheres, data, tokenizer)
    return rows, len(rows)


def checked_pair(row: dict[str, Any], data: DataSpec, tokenizer: Any, where: str) -> dict[str, Any]:
    """One row read and checked as a whole dataset's rows are (the preflight's sample)."""
    pair = (unpaired_row if data.format == "unpaired" else preference_row)(row, data.columns, where)
    _checked([pair], [where], data, tokenizer)
    return pair


def for_kto(dataset: Any, seed: int, shuffle: bool = True) -> Any:
    """KTO's examples in an order whose batches mix desirable and undesirable ones. TRL's KTOTrainer samples in
    order (its KL estimate pairs each example with its neighbour's completion), so data sorted by label, or pairs
    unpaired as all chosen then all rejected, would train whole batches of one kind, and a pair's own answers would
    be neighbours. Each pair gives one of each; then one shuffle with training.seed, unless the job asked for the
    data's own order (training.extraArgs.train_sampling_strategy: sequential, a curriculum)."""
    import datasets

    if "chosen" in dataset.column_names:
        dataset = datasets.Dataset.from_list([
            {"prompt": row["prompt"], "completion": row[key], "label": key == "chosen"}
            for row in dataset for key in ("chosen", "rejected")])
    return dataset.shuffle(seed=seed).flatten_indices() if shuffle else dataset


def prepare_preference(data: DataSpec, tokenizer: Any, seed: int, objective: str = "dpo",
                       sequential: bool = False) -> PreparedData:
    """Checked pairs (or unpaired examples) as datasets (train, and validation from data.validation or the split
    percentage); KTO's in an order it can train on (for_kto; `sequential`: the data's own order)."""
    import datasets

    train_rows, seen = _rows(load_rows(data.train, data), data, tokenizer, data.max_train_samples)
    if not train_rows:
        raise DataError(f"the {data.format} data has no rows")
    train = datasets.Dataset.from_list(train_rows)
    evaluation = None
    unit = "examples" if data.format == "unpaired" else "pairs"
    stats: dict[str, dict[str, int]] = {"train": {"rows": seen, unit: len(train_rows)}}
    if data.validation:
        eval_rows, eval_seen = _rows(load_rows(data.validation, data), data, tokenizer, data.max_eval_samples)
        evaluation = datasets.Dataset.from_list(eval_rows)
        stats["validation"] = {"rows": eval_seen, unit: len(eval_rows)}
    elif data.validation_split_percentage > 0:
        split = train.train_test_split(test_size=data.validation_split_percentage / 100, seed=seed)
        train, evaluation = split["train"], split["test"]
        if data.max_eval_samples is not None:
            evaluation = evaluation.select(range(min(len(evaluation), data.max_eval_samples)))
        stats["train"][unit], stats["validation"] = len(train), {unit: len(evaluation)}
    if objective == "kto":
        train = for_kto(train, seed, shuffle=not sequential)
        evaluation = for_kto(evaluation, seed) if evaluation is not None else None
        stats["train"]["examples"] = len(train)
        if evaluation is not None:
            stats["validation"]["examples"] = len(evaluation)
    return PreparedData(train=train, eval=evaluation, stats=stats)
