"""Chat templates someone else wrote: the ones TRL ships (trl/chat_templates, the model families' own templates as
published), axolotl's [INST] templates (Llama-2 / Mistral) and unsloth's (its own, Zephyr, Vicuna, Alpaca, ChatML,
Gemma, Phi, Llama, Qwen, GPT-OSS, Starling, Yi ...), read from the packages' files, never imported or copied here."""

import ast
import copy
import os
import re
import zipfile
from pathlib import Path

# The model families users bring (issue: every real chat template); file names as the packages ship them.
TRL_TEMPLATES = ["llama3", "llama3_1", "llama3_2", "qwen2_5", "qwen3", "qwen3_5_think", "qwen3_5_nothink",
                 "qwen3_6", "qwen3_instruct_2507", "phi3", "phi3_5", "deepseekv3", "deepseek_r1_distill", "gptoss",
                 "gemma", "gemma3", "nemotron_3_nano", "glm4moe", "cohere2", "lfm2"]
AXOLOTL_TEMPLATES = ["mistral_v1", "mistral_v2v3", "mistral_v7_tekken", "llama3"]
AXOLOTL_WHEEL = "axolotl-0.19.0-py3-none-any.whl"
UNSLOTH_WHEEL = "unsloth-2026.10.9-py3-none-any.whl"
# Strings in a template that are tokens of the model's vocabulary: added as special tokens of the test tokenizer.
TOKEN_PATTERN = re.compile(r"<\|[^'\"<>|\s]{1,40}\|>|<\|[a-z_]{1,40}>|<[a-z_]{1,40}\|>|<｜[^'\"<>]{1,40}?｜>|"
                           r"</?(?:think|start_of_turn|end_of_turn|extra_id_\d+|SPECIAL_\d+|tool_call|tool_response)>|"
                           r"\[/?(?:INST|SYSTEM_PROMPT|AVAILABLE_TOOLS|TOOL_CALLS)\]|<turn>|<\|?channel\|?>")


def trl_template(name: str) -> str:
    import trl

    return (Path(trl.__file__).parent / "chat_templates" / f"{name}.jinja").read_text()


def axolotl_template(name: str) -> str:
    cache = Path(os.environ.get("FINETUNE_CACHE", Path.home() / ".cache" / "finetunejob"))
    with zipfile.ZipFile(cache / "test-data" / AXOLOTL_WHEEL) as wheel:
        return wheel.read(f"axolotl/utils/chat_templates/templates/{name}.jinja").decode()


def unsloth_templates() -> dict[str, str]:
    """Every template unsloth/chat_templates.py defines as a module-level string (`<family>_template = "..."`),
    read from the wheel's file with ast (importing unsloth would need a GPU)."""
    cache = Path(os.environ.get("FINETUNE_CACHE", Path.home() / ".cache" / "finetunejob"))
    with zipfile.ZipFile(cache / "test-data" / UNSLOTH_WHEEL) as wheel:
        source = wheel.read("unsloth/chat_templates.py").decode()
    out = {}
    for node in ast.parse(source).body:
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)):
            continue
        for target in node.targets:
            if isinstance(target, ast.Name) and target.id.endswith("_template") and "{%" in node.value.value:
                out[target.id.removesuffix("_template")] = node.value.value
    return out


def shipped_templates() -> dict[str, str]:
    """id -> template text, for every template above."""
    out = {f"trl/{name}": trl_template(name) for name in TRL_TEMPLATES}
    out.update({f"axolotl/{name}": axolotl_template(name) for name in AXOLOTL_TEMPLATES})
    out.update({f"unsloth/{name}": text for name, text in unsloth_templates().items()})
    return out


def tokenizer_for(base, template: str, name: str):
    """The tiny tokenizer wearing a real template: the template's own tokens added as special tokens, as the
    model family's tokenizer has them."""
    tokenizer = copy.deepcopy(base)
    found = sorted(set(TOKEN_PATTERN.findall(template)))
    tokenizer.add_tokens(found, special_tokens=True)
    tokenizer.chat_template = template
    tokenizer.name_or_path = name
    return tokenizer
