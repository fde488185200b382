"""The rules of method.objective grpo that span sections: its data, batch shape, lengths and hardware."""

from typing import Any

from .errors import FieldError

PROMPT_FORMATS = ("prompt", "alpaca", "sharegpt", "messages")  # what GRPO reads its prompts from


def grpo_rules(spec: Any) -> list[FieldError]:
    """Refusals with the numbers and the fix. `spec` has at least method, data and training (spec._objective_rules
    calls this for every objective: data.format prompt and method.grpo belong to grpo only)."""
    method, data = spec.method, spec.data
    if method.objective != "grpo":
        errors = []
        if method.grpo is not None:
            errors.append(FieldError("method.grpo", "set", f"GRPO settings, but method.objective is "
                                     f"{method.objective}", "set method.objective: grpo, or remove method.grpo"))
        if data.format == "prompt" and method.objective == "sft":  # preference objectives say what they train on
            errors.append(FieldError("data.format", "prompt", f"prompts without answers train only method.objective "
                                     f"grpo (they are what it generates from), not {method.objective}",
                                     "set method.objective: grpo (with method.grpo.rewards), or give the data "
                                     "its answers (format prompt_completion, messages, ...)"))
        return errors
    errors = []
    if method.grpo is None:
        return [FieldError("method.grpo", None, "method.objective grpo scores its completions with rewards",
                           "add method.grpo.rewards, e.g. [{type: exactMatch, column: answer}]")]
    if data.format not in PROMPT_FORMATS:
        errors.append(FieldError("data.format", data.format, "method.objective grpo generates its own completions "
                                 "from prompts", "set data.format: prompt (a prompt column, text or messages, plus "
                                 "the columns rewards read), or alpaca, sharegpt or messages (the prompt is the "
                                 "conversation up to its last user turn)"))
    for field, value, why in (("data.packing", data.packing, "completions are generated, not packed"),
                              ("data.streaming", data.streaming, "prompts are checked before training"),
                              ("data.trainOnPrompt", data.train_on_prompt, "only generated tokens are trained")):
        if value:
            errors.append(FieldError(field, value, f"not with method.objective grpo: {why}",
                                     f"remove {field.split('.')[1]}"))
    grpo = method.grpo
    if grpo.max_completion_length >= data.max_length:
        errors.append(FieldError("method.grpo.maxCompletionLength", grpo.max_completion_length,
                                 f"leaves no room for a prompt in data.maxLength {data.max_length} (prompt plus "
                                 "completion)", f"raise data.maxLength above {grpo.max_completion_length} (e.g. "
                                 f"{grpo.max_completion_length + 512}) or lower maxCompletionLength"))
    return errors + _batch_rules(spec) + _hardware_rules(spec)


def _batch_rules(spec: Any) -> list[FieldError]:
    """Each prompt's completions must land in one batch, where their rewards are compared (TRL refuses it later,
    with its own names); with numIterations > 1 a checkpoint must fall where a new batch is generated."""
    if not hasattr(spec, "distributed"):
        return []
    t, group = spec.training, spec.method.grpo.num_generations
    world = spec.distributed.world_size
    errors = []
    batch = t.per_device_train_batch_size * t.gradient_accumulation_steps * world
    if batch % group:
        per_device = next(p for p in range(t.per_device_train_batch_size, t.per_device_train_batch_size + group + 1)
                          if (p * t.gradient_accumulation_steps * world) % group == 0)
        divisors = [g for g in range(2, batch + 1) if batch % g == 0]
        other = f", or numGenerations: {max(d for d in divisors if d <= group)}" if any(
            d <= group for d in divisors) else ""
        errors.append(FieldError("training.perDeviceTrainBatchSize", t.per_device_train_batch_size,
                                 f"the global batch is {batch} completions ({t.per_device_train_batch_size} per "
                                 f"device x {t.gradient_accumulation_steps} accumulation x {world} process(es)), not a "
                                 f"multiple of method.grpo.numGenerations {group}: each prompt's {group} completions "
                                 "must be scored in one batch", f"set perDeviceTrainBatchSize: {per_device} "
                                 f"({per_device * t.gradient_accumulation_steps * world} completions, "
                                 f"{per_device * t.gradient_accumulation_steps * world // group} prompts a step)"
                                 + other))
    if t.eval_strategy != "no" and (t.per_device_eval_batch_size * world) % group:
        eval_batch = t.per_device_eval_batch_size * world
        per_device = next(p for p in range(t.per_device_eval_batch_size, t.per_device_eval_batch_size + group + 1)
                          if (p * world) % group == 0)
        errors.append(FieldError("training.perDeviceEvalBatchSize", t.per_device_eval_batch_size,
                                 f"the evaluation batch is {eval_batch} completions ({t.per_device_eval_batch_size} "
                                 f"per device x {world} process(es)), not a multiple of method.grpo.numGenerations "
                                 f"{group}", f"set perDeviceEvalBatchSize: {per_device}"))
    iterations = spec.method.grpo.num_iterations
    if (iterations > 1 and hasattr(spec, "checkpoints") and spec.checkpoints.save_strategy == "steps"
            and spec.checkpoints.save_steps % iterations):
        save = spec.checkpoints.save_steps
        errors.append(FieldError("checkpoints.saveSteps", save, f"method.grpo.numIterations {iterations} reuses "
                                 f"each batch of generations for {iterations} steps; a checkpoint between them "
                                 "resumes with new generations, not the ones it was trained on",
                                 f"use a multiple of {iterations}, e.g. {save + iterations - save % iterations}"))
    return errors


def _hardware_rules(spec: Any) -> list[FieldError]:
    if not hasattr(spec, "distributed") or spec.method.grpo.generation_backend != "vllm":
        return []
    if spec.distributed.gpus_per_node == 0:
        return [FieldError("method.grpo.generationBackend", "vllm", "vLLM generates on GPUs",
                           "use generationBackend: transformers on CPU, or request distributed.gpusPerNode")]
    return []
