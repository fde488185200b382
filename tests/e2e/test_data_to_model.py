"""What a user finally gets: `finetune run` on a chat dataset gives a model that stops (it emits its EOS after
the reply), and continued pretraining reads real text files (prose and code, several paragraphs)."""

import json
import subprocess
import sys

from tests.conftest import ROOT
from tests.support.trainer_run import TEST_ENV

COLOURS = [("Name a colour.", "Red."), ("Name a fruit.", "A pear."), ("Say hi.", "Hello there!"),
           ("Count to three.", "One, two, three.")]
PROSE = ("The quick brown fox jumps over the lazy dog.\nThe dog did not move.\n\n"
         "Cats and dogs are animals. Fish swim in the sea.\nThe sky is blue on a clear day.\n") * 3
CODE = ("def add(a, b):\n    \"\"\"Two plus two is four.\"\"\"\n    return a + b\n\n\n"
        "class Counter:\n    def __init__(self):\n        self.n = 0\n\n    def tick(self):\n        self.n += 1\n") * 3


def finetune_run(spec: dict, workdir) -> tuple[int, str]:
    doc = {"apiVersion": "finetunejob.dev/v1alpha1", "kind": "FineTuneJob", "metadata": {"name": "e2e-data"},
           "spec": spec}
    path = workdir / "job.yaml"
    path.write_text(json.dumps(doc))
    argv = [sys.executable, "-m", "finetune_operator", "run", str(path), "--output", str(workdir / "run")]
    env = {**TEST_ENV, "PATH": "/usr/bin:/bin", "HOME": str(workdir)}
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    return proc.returncode, proc.stdout + proc.stderr


def train_on_colours(model_dir, workdir):
    """A full fine-tune on the four question/answer conversations, long enough to learn where replies end."""
    rows = [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]} for q, a in COLOURS]
    code, out = finetune_run({
        "model": {"name": str(model_dir), "dtype": "float32"},
        "data": {"format": "messages", "maxLength": 64, "train": [{"inline": rows}]},
        "method": {"type": "full"},
        "training": {"maxSteps": 80, "learningRate": 0.005, "perDeviceTrainBatchSize": 4, "precision": "fp32",
                     "optim": "adamw_torch", "lrScheduler": "constant", "loggingSteps": 10, "seed": 1},
        "distributed": {"numNodes": 1, "gpusPerNode": 0},
        "checkpoints": {"saveStrategy": "no"}, "runPolicy": {"backoffLimit": 0}}, workdir)
    assert code == 0, out[-3000:]
    return workdir / "run" / "output" / "final"


def generated_replies(final, tokenizer, **generate):
    """question -> the token ids the trained model generates after its generation prompt (greedy)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(final, dtype="float32").eval()
    out = {}
    for question, _ in COLOURS:
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                               return_tensors="pt", return_dict=True)
        with torch.no_grad():
            ids = model.generate(**prompt, max_new_tokens=24, do_sample=False, pad_token_id=tokenizer.eos_token_id,
                                 **generate)
        out[question] = ids[0, prompt["input_ids"].shape[1]:].tolist()
    return out


def test_a_chat_model_trained_from_a_tokenizer_without_a_template_learns_to_stop(tmp_path):
    from transformers import AutoTokenizer

    from finetune_trainer.data.chat import DEFAULT_CHAT_TEMPLATE
    from finetune_trainer.tiny_model import build_tiny_model

    final = train_on_colours(build_tiny_model(tmp_path / "bare-model", chat_template=False), tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(final)
    assert tokenizer.chat_template == DEFAULT_CHAT_TEMPLATE  # final/ carries the template it was trained with
    replies = generated_replies(final, tokenizer, eos_token_id=tokenizer.eos_token_id)
    for question, answer in COLOURS:
        new = replies[question]
        assert tokenizer.eos_token_id in new, f"{question!r}: never stopped: {tokenizer.decode(new)!r}"
        assert tokenizer.decode(new[:new.index(tokenizer.eos_token_id)]) == answer


def test_continued_pretraining_on_text_files(tiny_model_dir, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "notes.txt").write_text(PROSE)
    (corpus / "counter.py.txt").write_text(CODE)
    code, out = finetune_run({
        "model": {"name": str(tiny_model_dir), "dtype": "float32"},
        "data": {"format": "text", "blockSize": 32, "train": [{"path": str(corpus)}]},
        "method": {"type": "full"},
        "training": {"maxSteps": 12, "learningRate": 0.003, "perDeviceTrainBatchSize": 2, "precision": "fp32",
                     "optim": "adamw_torch", "loggingSteps": 1, "seed": 1},
        "distributed": {"numNodes": 1, "gpusPerNode": 0}, "checkpoints": {"saveStrategy": "no"}}, tmp_path)
    assert code == 0, out[-3000:]
    summary = json.loads((tmp_path / "run" / "logs" / "node-0.result.json").read_text())
    assert summary["data"]["train"]["rows"] == 2  # two files, two documents (not one per line)
    records = [json.loads(line) for line in (tmp_path / "run" / "output" / "progress.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if r.get("loss") is not None]
    assert losses[-1] < losses[0]
    assert "Succeeded: 12 steps" in out


PHI3_STYLE = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
              "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


def test_a_model_whose_template_stops_with_another_token_than_its_eos_stops_there(tmp_path):
    """Phi-3 style: replies close with <|end|>, the model's EOS is </s>. Trained, the saved generation_config lists
    both, so a plain generate() stops after the reply instead of generating past <|end|> forever."""
    from transformers import AutoTokenizer, GenerationConfig

    from finetune_trainer.tiny_model import build_tiny_model

    model_dir = build_tiny_model(tmp_path / "phi-style", vocab_size=520)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|end|>"]})
    tokenizer.chat_template = PHI3_STYLE
    tokenizer.save_pretrained(model_dir)
    end = tokenizer.convert_tokens_to_ids("<|end|>")
    assert GenerationConfig.from_pretrained(model_dir).eos_token_id == tokenizer.eos_token_id != end
    final = train_on_colours(model_dir, tmp_path)
    assert GenerationConfig.from_pretrained(final).eos_token_id == [tokenizer.eos_token_id, end]
    replies = generated_replies(final, tokenizer)  # no eos_token_id: the saved generation_config decides
    for question, answer in COLOURS:
        new = replies[question]
        assert new[-1] == end, f"{question!r}: did not stop at <|end|>: {tokenizer.decode(new)!r}"
        assert tokenizer.decode(new[:-1]) == answer
