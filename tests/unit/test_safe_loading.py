"""What a trainer process loads is data: a pickle that would run code, wherever it sits in a checkpoint and whichever
library reads it, is refused before anything of it runs; what DeepSpeed and torch.distributed.checkpoint really
write still loads, equal to what was saved.

Each case runs in a process of its own: safe_loading.enforce() changes its process for good (torch's switch, the
classes allowed), as it does in a trainer.
"""

import os
import subprocess
import sys
import textwrap

import pytest

from finetune_trainer.training import safe_loading

# A pickle whose loading runs a command: it writes the file named by RAN. Evil is defined in every script.
PRELUDE = textwrap.dedent("""
    import os, pickle, sys, tempfile
    from pathlib import Path
    RAN = Path(sys.argv[1])
    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {RAN}",))
    def enforce():
        from finetune_trainer.training import safe_loading
        safe_loading.enforce()
""")

# Every way a checkpoint of ours is read: DeepSpeed's engine (weights_only=False), torch.load as transformers and
# peft call it, torch.load told weights_only=False, torch.distributed.checkpoint's metadata (pickle.load) and its
# entries stored as bytes (weights_only=False), and the switch that would turn torch's off set in the environment.
PLANTED = {
    "deepspeed-engine": """
        import torch
        torch.save(Evil(), d := tempfile.mktemp())
        enforce()
        from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine
        TorchCheckpointEngine().load(d)
    """,
    "torch-load-default": """
        import torch
        torch.save({"optimizer": Evil()}, d := tempfile.mktemp())
        enforce()
        torch.load(d)
    """,
    "torch-load-weights-only-false": """
        import torch
        torch.save([Evil()], d := tempfile.mktemp())
        enforce()
        torch.load(d, map_location="cpu", weights_only=False)
    """,
    "switch-off-in-the-environment": """
        import torch
        os.environ["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] = "1"
        torch.save(Evil(), d := tempfile.mktemp())
        enforce()
        torch.load(d, weights_only=False)
    """,
    "dcp-metadata": """
        import torch, torch.distributed.checkpoint as dcp
        d = tempfile.mkdtemp()
        dcp.save({"w": torch.ones(2)}, checkpoint_id=d)
        Path(d, ".metadata").write_bytes(pickle.dumps(Evil()))
        enforce()
        dcp.load({"w": torch.zeros(2)}, checkpoint_id=d)
    """,
    "dcp-bytes-entry": """
        import torch, torch.distributed.checkpoint as dcp
        d = tempfile.mkdtemp()
        dcp.save({"w": torch.ones(2), "extra": Evil()}, checkpoint_id=d)
        enforce()
        dcp.load({"w": torch.zeros(2), "extra": None}, checkpoint_id=d)
    """,
}


def run(script: str, ran) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    env.pop(safe_loading.FORCE, None)
    return subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(script), str(ran)],
                          capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.parametrize("way", PLANTED)
def test_a_planted_pickle_is_refused_before_any_of_it_runs(way, tmp_path):
    ran = tmp_path / "ran"
    result = run(PLANTED[way], ran)
    assert result.returncode != 0, result.stdout + result.stderr
    assert not ran.exists(), "the pickle's command ran"
    assert safe_loading.refusal(RuntimeError(result.stderr)) is not None, result.stderr[-3000:]


def test_without_enforce_the_same_pickle_runs(tmp_path):
    # The control: the cases above fail for the reason they claim (DeepSpeed's loader runs it unless enforced).
    ran = tmp_path / "ran"
    result = run(PLANTED["deepspeed-engine"].replace("enforce()", "pass"), ran)
    assert ran.exists(), result.stderr[-3000:]


def test_what_deepspeed_and_torch_distributed_checkpoint_write_still_loads_equal(tmp_path):
    script = """
        import torch, torch.distributed.checkpoint as dcp
        from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
        from deepspeed.runtime.zero.config import ZeroStageEnum
        from deepspeed.utils.tensor_fragment import fragment_address
        scaler = DynamicLossScaler(init_scale=2**16, scale_window=100, min_scale=1, delayed_shift=2,
                                   consecutive_hysteresis=False)
        scaler.cur_iter = 17
        state = {"loss_scaler": scaler, "static": LossScaler(1.0), "zero_stage": ZeroStageEnum.gradients,
                 "mappings": [{"w": fragment_address(numel=6, start=2)}], "shapes": [torch.Size([2, 3])],
                 "ds_version": "0.19", "flags": {1, 2}, "t": torch.arange(4.0)}
        torch.save(state, f := tempfile.mktemp())
        sd = {"w": torch.randn(3, 4), "b": torch.ones(2, dtype=torch.bfloat16),
              "opt": {"state": {0: {"step": torch.tensor(3.0)}},
                      "param_groups": [{"lr": 0.1, "betas": (0.9, 0.99), "params": [0]}]}, "n": 7}
        dcp.save(sd, checkpoint_id=(d := tempfile.mkdtemp()))
        enforce()
        from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine
        back = TorchCheckpointEngine().load(f)
        assert vars(back["loss_scaler"]) == vars(scaler) and back["loss_scaler"].cur_scale == 2**16
        assert type(back["static"]) is LossScaler and back["zero_stage"] is ZeroStageEnum.gradients
        assert back["mappings"][0]["w"] == fragment_address(numel=6, start=2)
        assert back["shapes"] == [torch.Size([2, 3])] and back["flags"] == {1, 2}
        assert torch.equal(back["t"], state["t"])
        out = {"w": torch.zeros(3, 4), "b": torch.zeros(2, dtype=torch.bfloat16),
               "opt": {"state": {0: {"step": torch.tensor(0.0)}},
                       "param_groups": [{"lr": 0.0, "betas": (0, 0), "params": [0]}]}, "n": 0}
        dcp.load(out, checkpoint_id=d)
        assert torch.equal(out["w"], sd["w"]) and torch.equal(out["b"], sd["b"]) and out["n"] == 7
        assert out["opt"]["param_groups"] == sd["opt"]["param_groups"]
        assert out["opt"]["state"][0]["step"].item() == 3.0
        print("LOADED")
    """
    result = run(script, tmp_path / "ran")
    assert result.returncode == 0 and "LOADED" in result.stdout, result.stderr[-3000:]


def test_a_refusal_is_found_through_what_wraps_it():
    import pickle

    try:
        try:
            raise pickle.UnpicklingError("Weights only load failed. ...\nGLOBAL posix.system was not an allowed global")
        except pickle.UnpicklingError as inner:
            raise RuntimeError("rank 0 failed to load") from inner
    except RuntimeError as outer:
        assert safe_loading.refusal(outer) == "GLOBAL posix.system was not an allowed global"
    assert safe_loading.refusal(RuntimeError("CUDA out of memory")) is None
