"""Token labels from the character spans a model must generate: a token is learned where it overlaps a span,
everything else is IGNORE_INDEX (what the loss skips)."""

from typing import Any

IGNORE_INDEX = -100


def labels_of_encoding(encoding: Any, spans: list[tuple[int, int]], ids: list[int] | None = None) -> list[int]:
    """labels_from_spans for a tokenizers Encoding (whose `ids` may be passed in): each span's first and last token
    by character lookup, so the cost is per span, not per token."""
    ids = encoding.ids if ids is None else ids
    labels = [IGNORE_INDEX] * len(ids)
    for start, end in spans:
        if end <= start:
            continue
        first, last = encoding.char_to_token(start), encoding.char_to_token(end - 1)
        if first is None or last is None:  # a character no token covers (normalized away): the general way
            return labels_from_spans(ids, encoding.offsets, spans)
        labels[first:last + 1] = ids[first:last + 1]
    return labels


def labels_from_spans(ids: list[int], offsets: Any, spans: list[tuple[int, int]]) -> list[int]:
    """A token is learned when its characters overlap a trainable span (a SentencePiece "▁word" token that starts
    with the prompt's space and carries the reply's first word is learned: the model must produce it)."""
    import numpy as np

    if not ids:
        return []
    bounds = np.asarray(offsets, dtype=np.int64).reshape(len(ids), 2)
    learned = np.zeros(len(ids), dtype=bool)
    for start, end in spans:
        learned |= (bounds[:, 0] < end) & (bounds[:, 1] > start)
    return np.where(learned, np.asarray(ids, dtype=np.int64), IGNORE_INDEX).tolist()
