"""MFU: model FLOPs per token from the real parameter counts, over a datasheet (or configured) peak."""

import pytest

from finetune_trainer.training import throughput as T


def test_full_fine_tune_is_6n_without_the_input_embedding(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    total = sum(p.numel() for p in model.parameters())
    embedding = model.get_input_embeddings().weight.numel()
    counts = T.parameter_counts(model)
    assert counts.matmul == counts.trained_matmul == total - embedding  # lm_head (untied) stays: it is a matmul
    assert counts.flops_per_token == 6 * (total - embedding)


def test_lora_costs_about_4n(tiny_model_dir):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                           LoraConfig(r=4, target_modules="all-linear"))
    counts = T.parameter_counts(model)
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert counts.trained_matmul == trained and 0 < trained < counts.matmul / 5
    assert counts.flops_per_token == 4 * counts.matmul + 2 * trained


def test_a_tied_lm_head_counts_as_a_matmul():
    import torch

    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.body = torch.nn.Embedding(10, 4), torch.nn.Linear(4, 4, bias=False)
            self.head = torch.nn.Linear(4, 10, bias=False)
            self.head.weight = self.embed.weight

        def get_input_embeddings(self):
            return self.embed

        def get_output_embeddings(self):
            return self.head

    assert T.parameter_counts(Tied()).matmul == 16 + 40


@pytest.mark.parametrize(("name", "precision", "expected"), [
    ("NVIDIA H100 80GB HBM3", "bf16", 989e12),
    ("NVIDIA H100 PCIe", "bf16", 756e12),
    ("NVIDIA A100-SXM4-80GB", "fp16", 312e12),
    ("NVIDIA A10G", "bf16", 70e12),
    ("NVIDIA H100 80GB HBM3", "fp32", None),  # no 16-bit tensor-core peak applies
    ("Some Future GPU", "bf16", None),
    (None, "bf16", None),  # CPU
])
def test_peak_flops_from_the_device_name(name, precision, expected):
    assert T.peak_flops(name, precision) == expected


def test_configured_peak_wins_and_mfu_is_the_ratio():
    peak = T.peak_flops(None, "fp32", configured_tflops=100.0)
    assert peak == 100e12
    counts = T.ParameterCounts(matmul=1_000_000_000, trained_matmul=1_000_000_000)  # a 1B full fine-tune
    assert T.mfu(5000.0, counts, peak) == pytest.approx(5000 * 6e9 / 100e12)  # 0.3
    assert T.mfu(5000.0, counts, None) is None
