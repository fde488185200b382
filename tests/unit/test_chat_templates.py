"""Every real chat template (as TRL, axolotl and unsloth ship them), every chat format, system prompts and several
turns: the ids we train on are one `apply_chat_template(..., tokenize=True)` of the whole conversation, and exactly
what the model generates after each generation prompt is learned: the text the template writes before the reply,
the reply, its end-of-turn tokens. Replies chosen to collide with the templates' own text (one letter, `assistant`,
`end`, a special token, the user's own words, nothing at all) are checked against the prefix that ends with the
generation prompt, rendered independently. TRL's SFT masking runs on the same rows."""

import re

import pytest

from finetune_operator.api.data import DataSpec
from finetune_trainer import data as D
from finetune_trainer.data.chat import ChatEncoder
from finetune_trainer.data.labels import IGNORE_INDEX
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
    # Before a reply: what the template writes after its generation prompt (GPT-OSS's channel, Qwen3's empty think
    # block, a separator space), never a user's or the system's words (checked below).
    pieces = [r".*?" + re.escape(r) + r"\s*" + stop for r in replies]
    text = learned(tokenizer, ids, labels)
    assert re.fullmatch(r"\s*" + r"\s*".join(pieces) + r"\s*", text, re.S), f"{name}: learned {text!r}"
    for q, _ in TURNS:
        assert q not in text and SYSTEM not in text


# Replies users really write (classification, multiple choice, yes/no) that also occur in templates' own text.
ADVERSARIAL = [*"abcdefghijklmnopqrstuvwxyzAEINST0123456789", "yes", "no", "assistant", "user", "system", "end",
               "start", "im", "eot", "INST", "header", "turn", "model", "Response", "###", ":", "\n", " ", ""]


def oracle(tokenizer, encoder, messages) -> set[int]:
    """The tokens a model generates after the generation prompt, found without our encoder's layout: the text is
    rendered whole and up to the generation prompt; what lies between the prompt's end and the end of the last
    end-of-turn token is learned (single-turn conversations: the reply is the last thing the template writes)."""
    def render(m, prompt=False):
        return tokenizer.apply_chat_template(m, tokenize=False, add_generation_prompt=prompt)

    _, rendered = encoder.render(messages)  # Gemma (v1) refuses a system turn: folded into the user's
    text = encoder._closed(render(rendered), rendered)
    prefix = rendered[:-1]
    without_system = [m for m in rendered if m["role"] != "system"]
    if not text.startswith(render(prefix, True)) and encoder._closed(render(without_system), rendered) == text:
        prefix = without_system[:-1]  # Mistral writes the system prompt only into the last user turn
    prompt = render(prefix, True)
    start = len(prompt)
    if not text.startswith(prompt):  # DeepSeek-R1's prompt opens <think>: generation starts where they part
        start = next(i for i, (a, b) in enumerate(zip(prompt, text, strict=False)) if a != b)
        assert start >= len(render(prefix)), (prompt, text)
    end = max(text.rfind(m) + len(m) for m in encoder.end_markers)
    offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    return {i for i, (a, b) in enumerate(offsets) if a < end and b > start}


@pytest.mark.parametrize("path", ["layout", "per-row"])
def test_short_and_colliding_replies_are_learned_where_the_model_generates_them(templated, path, monkeypatch):
    """Both ways of locating replies: the shape's layout (the common path) and the per-row prefix renders (for rows
    whose template changes the text around a content)."""
    name, tokenizer = templated
    encoder = ChatEncoder.for_tokenizer(tokenizer)
    per_row = []
    if path == "per-row":
        monkeypatch.setattr(ChatEncoder, "layout", lambda self, roles: None)
    else:  # the common path really is the layout (GLM writes a blank reply differently: that one goes per row)
        by_prefix = ChatEncoder._spans_by_prefix
        monkeypatch.setattr(ChatEncoder, "_spans_by_prefix",
                            lambda self, text, messages: per_row.append(messages[-1]["content"]) or
                            by_prefix(self, text, messages))
    special = sorted(t for t in encoder.end_markers if t)[0]
    wrong = []
    for reply in [*ADVERSARIAL, special]:
        for system in (None, f"Answer with {reply!r} when unsure."):
            question = reply if reply.strip() else "Say nothing."  # the reply equal to the user's message
            messages = ([{"role": "system", "content": system}] if system else []) + [
                {"role": "user", "content": question}, {"role": "assistant", "content": reply}]
            ids, labels = encoder.encode(messages)
            ours = {i for i, lab in enumerate(labels) if lab != IGNORE_INDEX}
            if ours != oracle(tokenizer, encoder, messages):
                wrong.append((reply, system is not None, learned(tokenizer, ids, labels)))
    assert not wrong, f"{name}: {len(wrong)} replies learned elsewhere: {wrong[:5]}"
    assert all(not reply.strip() for reply in per_row), per_row


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


KNOWN_STOPS = {"trl/phi3": "<|end|>", "trl/gptoss": "<|return|>", "trl/glm4moe": "<|user|>", "trl/llama3": "<|eot_id|>",
               "trl/cohere2": "<|END_OF_TURN_TOKEN|>", "trl/qwen2_5": "<|im_end|>", "trl/gemma": "<end_of_turn>",
               "unsloth/gemma4": "<turn|>", "unsloth/vicuna": "</s>"}


def test_the_stop_a_template_trains_is_the_one_after_its_last_reply(templated):
    """What the saved generation_config must stop at (finetune_trainer.training.model.add_stop_ids): the token the
    template writes right after the conversation's last reply (for GLM, the next-turn token we append)."""
    name, tokenizer = templated
    encoder = ChatEncoder.for_tokenizer(tokenizer)
    stops = encoder.stop_tokens()
    assert stops, f"{name}: no stop token"
    messages = ROWS["messages"]["messages"]
    text, rendered = encoder.render(messages)
    after_last = text[text.rindex(rendered[-1]["content"]) + len(rendered[-1]["content"]):]
    assert after_last.lstrip().startswith(stops[0]) or stops[0] in after_last.split("\n")[0], (name, after_last)
    if name in KNOWN_STOPS:
        assert stops == [KNOWN_STOPS[name]]


def test_a_model_stops_at_the_trained_stop_as_well_as_at_its_own_eos(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from finetune_operator.api.spec import FineTuneJobSpec
    from finetune_trainer.training.model import add_stop_ids, load_tokenizer, trained_stop_ids

    spec = FineTuneJobSpec.model_validate({"model": {"name": str(tiny_model_dir)}, "data": {
        "format": "messages", "train": [{"inline": [ROWS["messages"]]}]}})
    tokenizer = tokenizer_for(load_tokenizer(spec), TEMPLATES["trl/phi3"], "phi3")  # closes replies with <|end|>
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    own = model.generation_config.eos_token_id
    stops = trained_stop_ids(spec, tokenizer)
    assert stops == [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|end|>")]
    assert add_stop_ids(model, stops) == [own, tokenizer.convert_tokens_to_ids("<|end|>")]
    assert model.generation_config.eos_token_id == [own, tokenizer.convert_tokens_to_ids("<|end|>")]
    text = FineTuneJobSpec.model_validate({"model": {"name": "m"}, "data": {"format": "text", "train": [
        {"inline": [{"text": "x"}]}]}})
    assert trained_stop_ids(text, tokenizer) == []


def test_system_prompts_a_template_refuses_are_folded_counted_and_said_once(tiny_tokenizer):
    from finetune_operator.api.spec import FineTuneJobSpec
    from finetune_trainer.training import advice

    gemma = tokenizer_for(tiny_tokenizer, TEMPLATES["trl/gemma"], "google/gemma-7b-it")
    rows = [ROWS["messages"], {"messages": ROWS["messages"]["messages"][1:]}] * 3  # 3 of 6 with a system prompt
    data = DataSpec.model_validate({"format": "messages", "train": [{"inline": rows}], "maxLength": 4096})
    _, stats = D.tokenize(rows, data, gemma)
    assert stats.system_folded == 3 and stats.kept == 6
    spec = FineTuneJobSpec.model_validate({"model": {"name": "google/gemma-7b-it"}, "data": data.model_dump()})
    said: list[tuple[str, str]] = []
    advice.folded_system(spec, {"train": stats.as_dict(), "eval": {"system_folded": 1}}, lambda *w: said.append(w))
    assert len(said) == 1 and said[0][0] == "SystemPromptFolded" and "in 4 row(s)" in said[0][1]
    qwen = tokenizer_for(tiny_tokenizer, TEMPLATES["trl/qwen2_5"], "qwen")
    assert D.tokenize(rows, data, qwen)[1].system_folded == 0
