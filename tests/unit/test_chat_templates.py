"""Every real chat template (as TRL and axolotl ship them), every chat format, system prompts and several turns:
the ids we train on are one `apply_chat_template(..., tokenize=True)` of the whole conversation, and exactly the
assistant replies with the template's end-of-turn tokens are learned. TRL's SFT masking runs on the same rows."""

import re

import pytest

from finetune_operator.api.data import DataSpec
from finetune_trainer import data as D
from finetune_trainer.chat import IGNORE_INDEX, ChatEncoder
from tests.support.chat_templates import shipped_templates, tokenizer_for

TEMPLATES = shipped_templates()
SYSTEM = "You are terse."
TURNS = [("Name a colour.", "Red."), ("And another one?", "Blue is one too."), ("Thanks!", "You are welcome.")]
ROWS = {
    "messages": {"messages": [{"role": "system", "content": SYSTEM}, *[
        m for q, a in TURNS for m in ({"role": "user", "content": q}, {"role": "assistant", "content": a})]]},
    "sharegpt": {"system": SYSTEM, "conversations": [
        t for q, a in TURNS for t in ({"from": "human", "value": q}, {"from": "gpt", "value": a})]},
    "alpaca": {"system": SYSTEM, "instruction": TURNS[0][0], "input": "Any will do.", "output": TURNS[0][1]},
}
# The model's template writes no stop after the last reply (GLM stops at the next role token, <|user|>): we append
# that token after the last reply, as GLM's own fine-tuning does, so that single-turn data teaches the model to stop.
NO_FINAL_STOP = {"trl/glm4moe": "<|user|>"}


@pytest.fixture(scope="module", params=sorted(TEMPLATES), ids=lambda n: n)
def templated(request, tiny_tokenizer):
    return request.param, tokenizer_for(tiny_tokenizer, TEMPLATES[request.param], request.param)


def learned(tokenizer, ids, labels) -> str:
    return tokenizer.decode([t for t, lab in zip(ids, labels, strict=True) if lab != IGNORE_INDEX])


@pytest.mark.parametrize("fmt", sorted(ROWS))
def test_ids_are_one_inference_render_and_only_replies_with_their_stop_are_learned(templated, fmt):
    name, tokenizer = templated
    data = DataSpec.model_validate({"format": fmt, "train": [{"inline": [ROWS[fmt]]}], "maxLength": 4096})
    encoder = D.RowEncoder.build(data, tokenizer)
    ids, labels = encoder.encode(ROWS[fmt])

    messages = D.formats.CHAT_FORMATS[fmt](ROWS[fmt], data.columns)
    _, rendered = encoder.chat.render(messages)  # Gemma (v1) refuses a system turn: folded into the first user turn
    at_inference = list(tokenizer.apply_chat_template(rendered, tokenize=True, return_dict=True)["input_ids"])
    final_stop = tokenizer.convert_tokens_to_ids([NO_FINAL_STOP[name]]) if name in NO_FINAL_STOP else []
    assert encoder.chat.final_stop == NO_FINAL_STOP.get(name, "")
    assert ids == at_inference + final_stop

    markers = encoder.chat.end_markers
    assert markers, f"{name}: no end-of-turn token found, the model would never learn to stop"
    replies = [m["content"] for m in rendered if m["role"] == "assistant"]
    stop = "(?:" + "|".join(re.escape(m) for m in markers) + ")"
    pieces = [re.escape(r) + stop for r in replies]
    text = learned(tokenizer, ids, labels)
    assert re.fullmatch(r"\s*" + r"\s*".join(pieces) + r"\s*", text), f"{name}: learned {text!r}"
    for q, _ in TURNS:
        assert q not in text and SYSTEM not in text


def test_no_bos_that_the_template_does_not_write(tiny_tokenizer):
    llama3 = tokenizer_for(tiny_tokenizer, TEMPLATES["trl/llama3"], "llama3")  # writes bos_token itself
    qwen = tokenizer_for(tiny_tokenizer, TEMPLATES["trl/qwen2_5"], "qwen2.5")  # writes none
    messages = ROWS["messages"]["messages"]
    llama_ids, _ = ChatEncoder.for_tokenizer(llama3).encode(messages)
    qwen_ids, _ = ChatEncoder.for_tokenizer(qwen).encode(messages)
    assert llama_ids.count(llama3.bos_token_id) == 1 and llama_ids[0] == llama3.bos_token_id
    assert qwen.bos_token_id not in qwen_ids


def test_a_template_error_is_a_data_error_naming_the_model(tiny_tokenizer):
    gemma = tokenizer_for(tiny_tokenizer, TEMPLATES["trl/gemma"], "google/gemma-7b-it")
    two_users = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"},
                 {"role": "assistant", "content": "c"}]
    with pytest.raises(D.DataError, match=r"chat template of google/gemma-7b-it refused the conversation: "
                                          r"Conversation roles must alternate"):
        ChatEncoder.for_tokenizer(gemma).encode(two_users)


# --- TRL's SFT data utilities on the same rows -----------------------------------------------------------------
def trl_view(tokenizer, messages):
    """TRL's assistant-only loss: its training template (prefix-preserving, {% generation %}-marked) and the mask
    transformers derives from the markers; None when TRL has no training template for this model."""
    from trl.chat_template_utils import get_training_chat_template

    try:
        training = get_training_chat_template(tokenizer)
    except ValueError:
        return None
    if training is None:
        return None
    out = tokenizer.apply_chat_template(messages, chat_template=training, tokenize=True, return_dict=True,
                                        return_assistant_tokens_mask=True)
    return list(out["input_ids"]), list(out["assistant_masks"])


def test_trl_and_ours_on_the_same_rows(tiny_tokenizer):
    """Where TRL's training template renders what inference renders, we learn a subset of what TRL learns (TRL also
    learns the newline after the stop token, and for DeepSeek and GPT-OSS the assistant header, which is prompt);
    for Qwen3-style templates TRL trains on a text inference never renders; some templates TRL refuses."""
    messages = ROWS["messages"]["messages"]
    subset, different_text, refused = [], [], []
    for name, template in TEMPLATES.items():
        tokenizer = tokenizer_for(tiny_tokenizer, template, name)
        encoder = ChatEncoder.for_tokenizer(tokenizer)
        ids, labels = encoder.encode(messages)
        theirs = trl_view(tokenizer, encoder.render(messages)[1])
        if theirs is None:
            refused.append(name)
            continue
        trl_ids, mask = theirs
        if trl_ids != ids:
            different_text.append(name)
            continue
        ours = {i for i, lab in enumerate(labels) if lab != IGNORE_INDEX}
        assert ours <= {i for i, m in enumerate(mask) if m}, name
        subset.append(name)
    assert {"trl/qwen2_5", "trl/phi3", "trl/gemma3", "trl/gptoss", "trl/deepseekv3"} <= set(subset)
    assert {"trl/qwen3", "trl/qwen3_6"} <= set(different_text)
    assert {"trl/llama3_1", "axolotl/mistral_v1"} <= set(refused)  # ours handles them (test above)
