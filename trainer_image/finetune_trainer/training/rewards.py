"""method.grpo.rewards -> what TRL's GRPOTrainer calls: the built-ins, reward models and the user's own functions,
each function behind a guard that stops the run with the reward's name and the row when it fails.

A user function is imported here, in the trainer processes (from the image, or from a ConfigMap mounted into the
pod): a missing module or function, or one that cannot take TRL's keyword arguments, is refused before training.
At every call the guard checks what came back: one reward per completion, each a finite number or None (TRL's
"not applicable"); an exception is retried row by row to name the first row it fails on. Exit 78, permanent: the
same function fails the same way on a retry."""

import importlib
import inspect
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from finetune_operator.api.grpo import GrpoSpec, RewardSpec
from finetune_trainer.data.prompts import ROW_COLUMN
from finetune_trainer.errors import ConfigError

ROWS_SHOWN = 1


class RewardFunctionFailed(ConfigError):
    """A reward function is missing, raised, or returned what TRL cannot use."""

    reason = "RewardFunctionFailed"


def _where(index: int) -> str:
    return f"spec.method.grpo.rewards[{index}]"


def load_function(reward: RewardSpec, index: int, code_dirs: dict[str, str]) -> Callable[..., Any]:
    """`module:function` from the ConfigMap's mounted directory (put first on the module path) or the image."""
    assert reward.function is not None  # RewardSpec's rules
    module_name, name = reward.function.split(":", 1)
    directory = code_dirs.get(reward.config_map) if reward.config_map else None
    if directory is not None and Path(directory).is_dir() and directory not in sys.path:
        sys.path.insert(0, directory)
    where = f"{_where(index)}.function {reward.function}"
    looked = (f"ConfigMap {reward.config_map} (mounted at {directory})" if directory and Path(directory).is_dir()
              else f"ConfigMap {reward.config_map}, which is not mounted here (finetune run has no ConfigMaps: put "
              "the module on PYTHONPATH)" if reward.config_map else "the trainer image's module path (a module of "
              "your own: set configMap, or build an image FROM the trainer image with it)")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module_name.startswith(exc.name):
            raise RewardFunctionFailed(f"{where}: no module {module_name} in {looked}") from exc
        raise RewardFunctionFailed(f"{where}: importing {module_name} failed: {exc}") from exc
    except Exception as exc:  # the user's module raised while importing
        raise RewardFunctionFailed(f"{where}: importing {module_name} raised {type(exc).__name__}: {exc}") from exc
    func = getattr(module, name, None)
    if func is None:
        public = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise RewardFunctionFailed(f"{where}: module {module_name} ({getattr(module, '__file__', '?')}) has no "
                                   f"{name} (its functions: {', '.join(public) or 'none'})")
    if not callable(func):
        raise RewardFunctionFailed(f"{where}: {name} in {module_name} is a {type(func).__name__}, not a function")
    try:
        parameters = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):
        return func  # a builtin or C callable: nothing to check before it is called
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        raise RewardFunctionFailed(f"{where}: {name} takes no **kwargs; TRL calls reward functions with prompts, "
                                   "completions, completion_ids, every column of the row and trainer_state, "
                                   f"log_extra and log_metric by name: define it as def {name}(prompts, completions, "
                                   "**kwargs)")
    return func


def _row_of(rows: Sequence[Any] | None, i: int) -> str:
    return str(rows[i]) if rows is not None and i < len(rows) and rows[i] is not None else f"completion {i + 1}"


def _snippet(completions: Sequence[Any], i: int) -> str:
    from finetune_trainer.training.builtin_rewards import text_of

    text = text_of(completions[i]) if i < len(completions) else ""
    return repr(text[:120] + ("..." if len(text) > 120 else ""))


class _Guard:
    """Checks a reward function's answers; its __name__ is what TRL logs the reward under."""

    def __init__(self, func: Callable[..., Any], name: str, index: int):
        self.func, self.__name__, self.index = func, name, index

    def _failed(self, text: str) -> RewardFunctionFailed:
        return RewardFunctionFailed(f"{_where(self.index)} ({self.__name__}) {text}")

    def checked(self, out: Any, n: int, rows: Sequence[Any] | None, completions: Sequence[Any]) -> list[float | None]:
        try:
            values = list(out)
        except TypeError:
            raise self._failed(f"returned a {type(out).__name__}, not a list of {n} rewards") from None
        if len(values) != n:
            raise self._failed(f"returned {len(values)} rewards for {n} completions (one per completion, in "
                               f"order), from {_row_of(rows, 0)} on")
        result: list[float | None] = []
        for i, value in enumerate(values):
            if value is None:
                result.append(None)
                continue
            try:
                number = float(value)
            except (TypeError, ValueError):
                raise self._failed(f"returned {value!r} for {_row_of(rows, i)} (completion {_snippet(completions, i)})"
                                   ": expected a number or None") from None
            if not math.isfinite(number):
                raise self._failed(f"returned {number} for {_row_of(rows, i)} (completion "
                                   f"{_snippet(completions, i)}): rewards must be finite numbers (None skips a row)")
            result.append(number)
        return result

    def first_failing(self, args: dict[str, Any], n: int, rows: Sequence[Any] | None) -> tuple[int, Exception] | None:
        """The first row the function raises on, called alone (side effects do not matter: the run stops)."""
        for i in range(n):
            single = {k: [v[i]] if isinstance(v, list) and len(v) == n else v for k, v in args.items()}
            try:
                self.func(**single)
            except Exception as exc:
                return i, exc
        return None

    def raised(self, exc: Exception, args: dict[str, Any], n: int, rows: Sequence[Any] | None) -> RewardFunctionFailed:
        found = self.first_failing(args, n, rows)
        if found is None:
            return self._failed(f"raised {type(exc).__name__}: {exc} on a batch of {n} completions from "
                                f"{_row_of(rows, 0)} on (each row alone passes)")
        i, single = found
        return self._failed(f"raised {type(single).__name__}: {single} on {_row_of(rows, i)} (completion "
                            f"{_snippet(args['completions'], i)})")


class GuardedReward(_Guard):
    def __call__(self, prompts, completions, completion_ids=None, **kwargs):
        rows = kwargs.pop(ROW_COLUMN, None)
        args = {"prompts": prompts, "completions": completions, "completion_ids": completion_ids, **kwargs}
        try:
            out = self.func(**args)
        except RewardFunctionFailed:
            raise
        except Exception as exc:
            raise self.raised(exc, args, len(prompts), rows) from exc
        return self.checked(out, len(prompts), rows, completions)


class GuardedAsyncReward(_Guard):
    """For an async user function: TRL awaits it with the others at once."""

    async def __call__(self, prompts, completions, completion_ids=None, **kwargs):
        rows = kwargs.pop(ROW_COLUMN, None)
        args = {"prompts": prompts, "completions": completions, "completion_ids": completion_ids, **kwargs}
        try:
            out = await self.func(**args)
        except Exception as exc:
            raise self._failed(f"raised {type(exc).__name__}: {exc} on a batch from {_row_of(rows, 0)} on") from exc
        return self.checked(out, len(prompts), rows, completions)


def guard(func: Callable[..., Any], name: str, index: int) -> _Guard:
    return (GuardedAsyncReward if inspect.iscoroutinefunction(func) else GuardedReward)(func, name, index)


def reward_model(reward: RewardSpec, index: int, spec: Any) -> tuple[Any, Any]:
    """(model, tokenizer) of a model reward: a one-output sequence-classification model, evaluation mode."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from finetune_trainer.training.model import DTYPES, source

    where = f"{_where(index)}.model"
    name = source(reward.model, where)
    try:
        tokenizer = AutoTokenizer.from_pretrained(name, trust_remote_code=False)
        model = AutoModelForSequenceClassification.from_pretrained(
            name, num_labels=1, dtype=DTYPES[spec.model.dtype], trust_remote_code=False)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{where} {reward.model} cannot be loaded as a sequence-classification model: "
                          f"{str(exc).splitlines()[0][:300]}") from exc
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model.eval(), tokenizer


def build_rewards(grpo: GrpoSpec, spec: Any, code_dirs: dict[str, str]) -> tuple[list[Any], list[Any], list[str]]:
    """(reward_funcs, reward_processing_classes, names) for GRPOTrainer, in the order of method.grpo.rewards."""
    from finetune_trainer.training.builtin_rewards import builtin

    funcs, tokenizers, names = [], [], []
    for i, reward in enumerate(grpo.rewards):
        name = reward.default_name
        if reward.type == "model":
            model, tokenizer = reward_model(reward, i, spec)
            funcs.append(model)
            tokenizers.append(tokenizer)
        else:
            func = (load_function(reward, i, code_dirs) if reward.type == "function"
                    else builtin(reward, grpo.max_completion_length))
            funcs.append(guard(func, name, i))
            tokenizers.append(None)
        names.append(name)
    return funcs, tokenizers, names
