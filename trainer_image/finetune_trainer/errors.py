"""Errors that map to the permanent exit codes of the contract (finetune_operator.api.exit_codes)."""

from finetune_operator.api import exit_codes


class TrainerError(Exception):
    exit_code = 1


class ConfigError(TrainerError):
    """The config, model or tokenizer cannot work; retrying will not help."""

    exit_code = exit_codes.CONFIG_ERROR


class DataError(TrainerError):
    """The data cannot be read or yields nothing to train on."""

    exit_code = exit_codes.DATA_ERROR


class LossDiverged(TrainerError):
    exit_code = exit_codes.DIVERGED


class Interrupted(TrainerError):
    exit_code = exit_codes.INTERRUPTED
