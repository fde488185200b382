"""GRPO's rewards in the trainer: the built-ins on their edge cases, the guard around every function (a failure is
named with the reward and the row; None passes as TRL's "not applicable"), user functions imported from a module
path or a ConfigMap's directory and refused before training when they cannot work, the config TRL gets, and TRL's
logged metrics as progress records, status fields, the plot's reward panel and the summary's samples."""

import json
import math

import pytest

from finetune_operator.api.grpo import RewardSpec
from finetune_operator.api.status import Progress
from finetune_operator.api.validation import validate_job
from finetune_operator.cli.local_run import prepare
from finetune_trainer.data.prompts import ROW_COLUMN
from finetune_trainer.training import builtin_rewards as b
from finetune_trainer.training.grpo import completion_samples, grpo_record
from finetune_trainer.training.rewards import RewardFunctionFailed, guard, load_function
from tests.builders import make_job


def reward(**fields) -> RewardSpec:
    return RewardSpec.model_validate(fields)


def score(spec: RewardSpec, completions, max_length=16, **columns):
    func = b.builtin(spec, max_length)
    return func(prompts=["p"] * len(completions), completions=completions,
                completion_ids=[[1] * len(c) for c in completions], **columns)


# (case id, completion, reference, expected reward) for accuracy without math-verify
ACCURACY = [
    ("boxed-integer", "So it is \\boxed{42}.", "42", 1.0),
    ("last-number", "First 3, then 4, finally 12", "12", 1.0),
    ("last-number-wrong", "12 or maybe 13", "12", 0.0),
    ("fraction-vs-frac", "\\boxed{\\frac{1}{3}}", "1/3", 1.0),
    ("dfrac-vs-decimal", "\\boxed{\\dfrac{1}{2}}", "0.5", 1.0),
    ("nested-braces", "\\boxed{\\frac{2}{4}}", "\\boxed{1/2}", 1.0),
    ("thousands", "The total is 1,234.", "1234", 1.0),
    ("negative", "x = -7", "-7", 1.0),
    ("dollars-and-period", "\\boxed{$5$}.", "5", 1.0),
    ("text-answer", "\\boxed{x+1}", "x + 1", 1.0),
    ("text-answer-wrong", "\\boxed{x+2}", "x+1", 0.0),
    ("no-answer", "I do not know", "3", 0.0),
    ("empty-reference", "\\boxed{3}", "", None),
]


@pytest.mark.skipif(b.math_verify_available(), reason="math-verify installed: TRL's accuracy reward runs instead")
@pytest.mark.parametrize(("completion", "reference", "expected"), [a[1:] for a in ACCURACY],
                         ids=[a[0] for a in ACCURACY])
def test_accuracy_without_math_verify_compares_the_final_answer(completion, reference, expected):
    assert score(reward(type="accuracy"), [completion], solution=[reference]) == [expected]
    conversation = [[{"role": "assistant", "content": completion}]]  # TRL's completions of conversational prompts
    assert score(reward(type="accuracy", column="gold"), conversation, gold=[reference]) == [expected]


def test_exact_match_extracts_trims_and_folds_case_when_asked():
    spec = reward(type="exactMatch", extract="<answer>(.*?)</answer>", caseSensitive=False)
    completions = ["<think>hm</think><answer> Paris </answer>", "<answer>paris</answer>", "Paris", "<answer>Rome"]
    assert score(spec, completions, answer=["paris"] * 4) == [1.0, 1.0, 0.0, 0.0]
    assert score(reward(type="exactMatch"), ["  4\n", "4.", "four"], answer=[4, "4", "4"]) == [1.0, 0.0, 0.0]


def test_regex_searches_one_pattern_or_each_rows_own():
    assert score(reward(type="regex", pattern=r"\d{3}"), ["code 123", "code 12"]) == [1.0, 0.0]
    assert score(reward(type="regex", column="p"), ["cat", "cat"], p=["c.t", "^dog"]) == [1.0, 0.0]


@pytest.mark.parametrize(("layout", "completion", "expected"), [
    ("thinkAnswer", "<think>a</think>\n<answer>b</answer>", 1.0),
    ("thinkAnswer", "<think>a</think><answer>b</answer> extra", 0.0),
    ("thinkAnswer", "<answer>b</answer>", 0.0),
    ("thinkAnswer", "<think><think>a</think><answer>b</answer>", 0.0),
    ("think", "<think>\nreasoning\n</think>\nanswer", 1.0),
    ("think", "answer <think>late</think>", 0.0),
])
def test_format_rewards(layout, completion, expected):
    assert score(reward(type="format", format=layout), [completion]) == [expected]


@pytest.mark.parametrize(("tokens", "expected"), [(8, 0.0), (12, 0.0), (13, -0.25), (16, -1.0), (17, -1.0)])
def test_length_penalty_is_trls_soft_overlong_punishment(tokens, expected):
    """maxTokens 16, the last 4 soft: nothing up to 12 tokens, then linearly to -1 at 16, -1 past it."""
    spec = reward(type="length", maxTokens=16, softTokens=4)
    assert score(spec, ["x" * tokens]) == [pytest.approx(expected)]


def test_length_penalty_defaults_to_max_completion_length_and_a_hard_limit_without_soft_tokens():
    assert score(reward(type="length"), ["x" * 24, "x" * 33], max_length=32) == [pytest.approx(-0.0), -1.0]
    assert score(reward(type="length", maxTokens=10, softTokens=0), ["x" * 10, "x" * 11]) == [0.0, -1.0]


# --- the guard --------------------------------------------------------------------------------------------------

def call(func, n=3, **columns):
    guarded = guard(func, "mine", 2)
    prompts = [f"prompt {i}" for i in range(n)]
    return guarded(prompts=prompts, completions=[f"completion {i}" for i in range(n)], completion_ids=[[1]] * n,
                   **{ROW_COLUMN: [f"train.jsonl, row {i + 10}" for i in range(n)], **columns})


def test_the_guard_passes_numbers_and_none_and_hides_the_row_column():
    seen = {}

    def fine(prompts, completions, **kwargs):
        seen.update(kwargs)
        return [1, 0.5, None]

    assert call(fine, answer=["a", "b", "c"]) == [1.0, 0.5, None]
    assert ROW_COLUMN not in seen and seen["answer"] == ["a", "b", "c"]


@pytest.mark.parametrize(("func", "message"), [
    (lambda completions, **kw: [0.0] * (len(completions) - 1),
     "spec.method.grpo.rewards[2] (mine) returned 2 rewards for 3 completions"),
    (lambda completions, **kw: [0.0, math.nan, 0.0],
     "spec.method.grpo.rewards[2] (mine) returned nan for train.jsonl, row 11 (completion 'completion 1')"),
    (lambda completions, **kw: [0.0, 0.0, math.inf], "returned inf for train.jsonl, row 12"),
    (lambda completions, **kw: [0.0, "high", 0.0], "returned 'high' for train.jsonl, row 11"),
    (lambda completions, **kw: 1.0, "returned a float, not a list of 3 rewards"),
    (lambda completions, prompts, **kw: [1 / (p != "prompt 2") for p in prompts],
     "raised ZeroDivisionError: division by zero on train.jsonl, row 12 (completion 'completion 2')"),
], ids=["wrong-length", "nan", "infinity", "not-a-number", "not-a-list", "raises-on-one-row"])
def test_the_guard_names_the_reward_and_the_row(func, message):
    with pytest.raises(RewardFunctionFailed) as info:
        call(func)
    assert message in str(info.value), str(info.value)
    assert info.value.exit_code == 78 and info.value.reason == "RewardFunctionFailed"


def test_a_function_that_fails_only_on_whole_batches_says_so():
    def batch_only(completions, **kw):
        if len(completions) > 1:
            raise RuntimeError("batch too big")
        return [0.0]

    with pytest.raises(RewardFunctionFailed, match="on a batch of 3 completions from train.jsonl, row 10 on"):
        call(batch_only)


def test_an_async_function_is_awaited_and_checked():
    import asyncio

    async def later(completions, **kw):
        return [math.nan] * len(completions)

    guarded = guard(later, "async_one", 0)
    with pytest.raises(RewardFunctionFailed, match=r"\(async_one\) returned nan"):
        asyncio.run(guarded(prompts=["p"], completions=["c"], completion_ids=[[1]]))


# --- user functions ---------------------------------------------------------------------------------------------

def function_reward(function, config_map=None):
    fields = {"type": "function", "function": function}
    return reward(**fields, **({"configMap": config_map} if config_map else {}))


def test_a_function_from_a_config_maps_directory_is_imported_from_there(tmp_path):
    directory = tmp_path / "team-rewards"
    directory.mkdir()
    (directory / "grpo_test_cm_rewards.py").write_text("def score(prompts, completions, **kwargs):\n"
                                                       "    return [len(c) for c in completions]\n")
    func = load_function(function_reward("grpo_test_cm_rewards:score", "team-rewards"), 0,
                         {"team-rewards": str(directory)})
    assert func(prompts=["p"], completions=["abc"]) == [3]


@pytest.mark.parametrize(("function", "config_map", "message"), [
    ("no_such_module_anywhere:f", None, "no module no_such_module_anywhere in the trainer image's module path"),
    ("no_such_module_anywhere:f", "rewards", "ConfigMap rewards, which is not mounted here"),
    ("tests.support.grpo_rewards:absent", None, "has no absent (its functions: answer_mentioned, letters"),
    ("tests.support.grpo_rewards:no_kwargs", None, "no_kwargs takes no **kwargs"),
    ("math:pi", None, "pi in math is a float, not a function"),
], ids=["missing-module", "missing-config-map", "missing-function", "no-kwargs", "not-callable"])
def test_a_function_that_cannot_work_is_refused_before_training(function, config_map, message):
    with pytest.raises(RewardFunctionFailed) as info:
        load_function(function_reward(function, config_map), 4, {})
    assert str(info.value).startswith(f"spec.method.grpo.rewards[4].function {function}: "), str(info.value)
    assert message in str(info.value), str(info.value)


def test_a_module_that_raises_while_importing_is_named(tmp_path):
    directory = tmp_path / "cm"
    directory.mkdir()
    (directory / "grpo_test_broken_module.py").write_text("raise RuntimeError('needs a GPU')\n")
    with pytest.raises(RewardFunctionFailed, match="importing grpo_test_broken_module raised RuntimeError: needs a "
                                                   "GPU"):
        load_function(function_reward("grpo_test_broken_module:f", "cm"), 0, {"cm": str(directory)})


# --- what TRL gets, and what comes back -------------------------------------------------------------------------

def test_the_rendered_arguments_build_trls_grpo_config(tmp_path):
    from finetune_trainer.config import load_config, training_arguments

    doc = make_job({"spec.method": {"objective": "grpo", "type": "lora", "grpo": {
        "numGenerations": 4, "maxCompletionLength": 32, "temperature": 0.7, "topP": 0.9, "topK": 20, "beta": 0.01,
        "epsilon": 0.1, "epsilonHigh": 0.28, "lossType": "dr_grpo", "scaleRewards": "none", "numIterations": 2,
        "maskTruncatedCompletions": True,
        "rewards": [{"type": "format"}, {"type": "length", "weight": -0.5}]}},
        "spec.data": {"format": "prompt", "maxLength": 128, "train": [{"inline": [{"prompt": "p"}]}]},
        "spec.distributed": {"numNodes": 1, "gpusPerNode": 0},
        "spec.training": {"perDeviceTrainBatchSize": 4, "precision": "fp32"}, "spec.checkpoints.saveSteps": 10})
    config, _ = prepare(validate_job(doc), tmp_path)
    args = training_arguments(load_config(config))
    assert type(args).__name__ == "GRPOConfig"
    assert (args.num_generations, args.max_completion_length, args.temperature, args.top_p, args.top_k) == (
        4, 32, 0.7, 0.9, 20)
    assert (args.beta, args.epsilon, args.epsilon_high, args.loss_type, args.scale_rewards, args.num_iterations,
            args.mask_truncated_completions) == (0.01, 0.1, 0.28, "dr_grpo", "none", 2, True)
    assert args.reward_weights == [1.0, -0.5] and args.use_vllm is False and args.log_completions is False
    assert args.generation_batch_size == 4 and args.steps_per_generation == 1
    assert args.bf16 is False and args.activation_checkpointing is False  # the spec's, not TRL's defaults


TRL_LOGS = {"loss": 0.01, "reward": 0.75, "reward_std": 0.2, "kl": 0.003, "completions/mean_length": 11.5,
            "clip_ratio/region_mean": 0.0, "rewards/letters/mean": 0.7, "rewards/letters/std": 0.1,
            "rewards/format_think/mean": float("nan"), "rewards/format_think/std": float("nan"), "entropy": 5.1}


def test_trls_metrics_become_a_record_and_valid_status_fields():
    from finetune_trainer.training.callbacks import status_progress

    record = {"step": 3, "maxSteps": 10, "loss": 0.01, "learningRate": 1e-3, "tokensPerSecond": 10.0, "eta": None,
              "time": "2026-11-27T00:00:00Z", **grpo_record(TRL_LOGS, {})}
    assert record["reward"] == 0.75 and record["completionLength"] == 11.5 and record["clipRatio"] == 0.0
    assert record["rewardFunctions"] == [{"name": "letters", "mean": 0.7, "std": 0.1},
                                         {"name": "format_think", "mean": None, "std": None}]
    json.dumps(record, allow_nan=False)  # a reward that returned None everywhere is no NaN in JSON
    progress = Progress.model_validate(status_progress(record))  # what the apiserver's schema would take
    assert progress.reward == 0.75 and progress.reward_functions[0].name == "letters"
    assert progress.reward_functions[1].mean is None
    evaluation = grpo_record({"eval_loss": 0.1}, record)  # an evaluation's record keeps the training values
    assert evaluation["reward"] == 0.75 and evaluation["rewardFunctions"] == record["rewardFunctions"]


def test_the_plot_gets_a_reward_panel_with_each_reward_and_the_kl():
    from finetune_trainer.outputs.plot import loss_figure

    records = [{"step": s, "loss": 0.01 * s, "learningRate": 1e-3, **grpo_record({
        **TRL_LOGS, "reward": 0.1 * s, "rewards/letters/mean": 0.05 * s}, {})} for s in range(1, 6)]
    figure = loss_figure(records, "grpo")
    labels = {line.get_label(): line for axis in figure.axes for line in axis.get_lines()}
    assert {"mean reward (weighted sum)", "letters", "KL", "training loss"} <= set(labels)
    assert "format_think" not in labels  # never a number: nothing to draw
    assert list(labels["mean reward (weighted sum)"].get_ydata()) == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5])


def test_the_summary_shows_one_completion_per_prompt_with_its_rewards():
    logs = {"prompt": ["a", "a", "b", "b"], "completion": ["x1", "x2", "y1", "y2"],
            "rewards": {"letters": [1.0, 0.5, 0.0, 0.25], "length": [0.0, -1.0, math.nan, 0.0]}}
    samples = completion_samples(logs, [1.0, 0.5])
    assert samples == [{"prompt": "a", "completion": "x1", "rewards": {"letters": 1.0, "length": 0.0}, "reward": 1.0},
                       {"prompt": "b", "completion": "y1", "rewards": {"letters": 0.0, "length": None},
                        "reward": 0.0}]


def test_a_resumed_run_draws_each_epochs_prompts_as_the_uninterrupted_run_did():
    """TRL's RepeatSampler shuffles each epoch with the next draw of one generator; a resumed run starts a new
    sampler at a later epoch. With set_epoch (transformers calls it before every epoch) each epoch's order is the
    uninterrupted run's, whether the sampler iterated the epochs before it or not."""
    from trl.trainer.utils import RepeatSampler

    from finetune_trainer.training.grpo import resumable_sampler

    def sampler():
        return RepeatSampler(list(range(10)), mini_repeat_count=2, batch_size=3, repeat_count=2, seed=5)

    uninterrupted = sampler()
    epochs = [list(uninterrupted) for _ in range(4)]  # TRL's own, one run through four epochs
    assert len({tuple(e) for e in epochs}) == 4
    continued = resumable_sampler(sampler())
    for epoch in range(4):
        continued.set_epoch(epoch)
        assert list(continued) == epochs[epoch]
        resumed = resumable_sampler(sampler())  # a new process that resumes in this epoch
        resumed.set_epoch(epoch)
        assert list(resumed) == epochs[epoch]
