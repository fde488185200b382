"""spec.data: where the training data comes from, its format and how it becomes token sequences."""

from typing import Any, Literal

from pydantic import Field, model_validator

from .base import ApiModel
from .errors import FieldError, SpecRuleErrors
from .sources import LOCATION_SCHEMA, Location
from .volumes import AbsolutePath

DataFormat = Literal["alpaca", "sharegpt", "messages", "prompt_completion", "text", "preference", "unpaired",
                     "prompt"]
FileType = Literal["json", "jsonl", "parquet", "csv", "text"]

MAX_INLINE_ROWS = 1000


class HubDataset(ApiModel):
    name: Location = Field(min_length=1, max_length=512, json_schema_extra=LOCATION_SCHEMA,
                           description="Hub dataset id, e.g. tatsu-lab/alpaca.")
    config: str | None = Field(default=None, max_length=256, description="Dataset configuration (subset) name.")
    split: str = Field(default="train", min_length=1, max_length=256, description="Split, e.g. train or train[:10%].")
    revision: str | None = Field(default=None, max_length=256, description="Dataset revision to pin.")


class DataSource(ApiModel):
    """Exactly one of path, hub or inline."""

    path: Location | None = Field(
        default=None,
        min_length=1,
        max_length=4096,
        json_schema_extra=LOCATION_SCHEMA,
        description="A file, a directory or a glob on a mounted volume (json, jsonl, parquet, csv or text).",
    )
    hub: HubDataset | None = Field(default=None, description="A dataset on the Hugging Face Hub.")
    inline: list[dict[str, Any]] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_INLINE_ROWS,
        description=f"Rows written directly in the spec (at most {MAX_INLINE_ROWS}); for smoke tests and demos.",
    )
    file_type: FileType | None = Field(
        default=None, description="File type of `path`; inferred from the extension when unset. In a directory only "
        "the files of this type are read; unset, a README.md (a dataset card, as in a Hub dataset's files) beside "
        "other data files is skipped."
    )

    @model_validator(mode="after")
    def _exactly_one_origin(self) -> "DataSource":
        given = [k for k in ("path", "hub", "inline") if getattr(self, k) is not None]
        if len(given) != 1:
            raise SpecRuleErrors(
                [
                    FieldError(
                        "",
                        given or None,
                        "a data source needs exactly one of path, hub or inline",
                        "keep one of them" if given else "add path: /data/train.jsonl (or hub: or inline:)",
                    )
                ]
            )
        if self.file_type is not None and self.path is None:
            raise SpecRuleErrors(
                [FieldError("fileType", self.file_type, "fileType applies to path sources only", "remove fileType")]
            )
        return self


class ColumnMapping(ApiModel):
    """Maps the dataset's column names to the ones each format expects; unset means the format's default name."""

    instruction: str | None = Field(default=None, max_length=256, description="alpaca: instruction column.")
    input: str | None = Field(default=None, max_length=256, description="alpaca: optional input column.")
    output: str | None = Field(default=None, max_length=256, description="alpaca: response column.")
    system: str | None = Field(default=None, max_length=256, description="alpaca/sharegpt: system prompt column.")
    conversations: str | None = Field(
        default=None, max_length=256, description="sharegpt: list of turns with from/value."
    )
    messages: str | None = Field(default=None, max_length=256, description="messages: list of role/content turns.")
    prompt: str | None = Field(default=None, max_length=256, description="prompt_completion, preference, "
                               "unpaired and prompt: prompt column.")
    completion: str | None = Field(default=None, max_length=256, description="prompt_completion and unpaired: "
                                   "completion column.")
    chosen: str | None = Field(default=None, max_length=256, description="preference: the preferred answer's "
                               "column (text, or a list of role/content messages).")
    rejected: str | None = Field(default=None, max_length=256, description="preference: the other answer's column.")
    label: str | None = Field(default=None, max_length=256, description="unpaired: whether the completion is "
                              "desirable (true/false, 1/0, yes/no).")
    text: str | None = Field(default=None, max_length=256, description="text: raw text column.")


class DataSpec(ApiModel):
    train: list[DataSource] = Field(
        min_length=1, max_length=64, description="Training data sources, concatenated in order."
    )
    validation: list[DataSource] | None = Field(
        default=None, min_length=1, max_length=64, description="Validation sources; or use validationSplitPercentage."
    )
    validation_split_percentage: float = Field(
        default=0, ge=0, le=50, description="Percent of the training data held out for evaluation (0 = none)."
    )
    format: DataFormat = Field(
        description="Row format: alpaca (instruction/input/output), sharegpt (conversations from/value), messages "
        "(role/content, chat template), prompt_completion, text (continued pretraining), preference (prompt, "
        "chosen, rejected as text or as conversations, or LLaMA-Factory's alpaca and sharegpt pair layouts: "
        "method.objective dpo, kto, orpo, simpo, cpo or reward), unpaired (prompt, completion, label: "
        "method.objective kto) or prompt (a prompt as text or messages, and the columns rewards read: "
        "method.objective grpo, which also reads alpaca, sharegpt and messages rows as prompts)."
    )
    columns: ColumnMapping = Field(default_factory=ColumnMapping, description="Column renames for the format.")
    max_train_samples: int | None = Field(default=None, ge=1, description="Use at most this many training rows.")
    max_eval_samples: int | None = Field(default=None, ge=1, description="Use at most this many validation rows.")
    max_length: int = Field(
        default=2048, ge=16, le=1_048_576, description="Maximum tokens per training sequence: an SFT sample, or a "
        "preference objective's prompt and answer (a prompt that leaves no room for an answer is a data error)."
    )
    block_size: int | None = Field(
        default=None,
        ge=16,
        le=1_048_576,
        description="text format: the concatenated corpus is cut into blocks of this many tokens (default maxLength).",
    )
    text_split: Literal["document", "paragraph", "line"] = Field(
        default="document",
        description="text format, .txt files: one document per file (default), per paragraph (blank-line "
        "separated) or per line. Newlines are kept and one EOS follows each document; JSONL/CSV/Parquet text rows "
        "are one document each.",
    )
    truncation: Literal["truncate", "drop"] = Field(
        default="truncate", description="What to do with SFT samples longer than maxLength; counts are reported. "
        "SFT only: TRL's preference trainers truncate (a reward model leaves long pairs out)."
    )
    packing: bool = Field(
        default=False,
        description="Pack several SFT samples into one sequence without attention across sample boundaries.",
    )
    train_on_prompt: bool = Field(
        default=False, description="Also compute the loss on prompt/user tokens (by default they are masked out). "
        "SFT only."
    )
    preprocessing_workers: int = Field(default=1, ge=1, le=256, description="Processes used to tokenize.")
    streaming: bool = Field(
        default=False, description="Stream the dataset instead of tokenizing it up front (needs training.maxSteps)."
    )
    cache_dir: AbsolutePath | None = Field(
        default=None, max_length=4096,
        description="Where Hub downloads (HF_HOME: models, tokenizers, datasets), models from object storage and "
        "tokenized data are cached; default the pod's own emptyDir (/cache, on the node's disk), so each new pod "
        "downloads again. "
        "Point it into a writable volume of pod.volumes (e.g. a team's shared cache claim) so that every job "
        "downloads a model once: "
        "whoever can write that volume chooses the weights jobs load from it (a model with trustRemoteCode is always "
        "downloaded into the pod, and remote code never comes from the cache). `finetune run` uses your own HF_HOME "
        "and the run's output directory instead.")

    @model_validator(mode="after")
    def _data_rules(self) -> "DataSpec":
        errors: list[FieldError] = []
        if self.validation is not None and self.validation_split_percentage > 0:
            errors.append(
                FieldError(
                    "validationSplitPercentage",
                    self.validation_split_percentage,
                    "a validation source and a split percentage are exclusive",
                    "remove validationSplitPercentage or validation",
                )
            )
        if self.block_size is not None and self.format != "text":
            errors.append(
                FieldError("blockSize", self.block_size, "blockSize applies to format text only", "use maxLength")
            )
        if self.packing and self.format == "text":
            errors.append(
                FieldError(
                    "packing", True, "format text is always cut into full blocks; packing is for SFT formats",
                    "remove packing",
                )
            )
        if self.text_split != "document" and self.format != "text":
            errors.append(FieldError("textSplit", self.text_split, "textSplit applies to format text only",
                                     "remove textSplit"))
        if self.train_on_prompt and self.format == "text":
            errors.append(
                FieldError("trainOnPrompt", True, "format text has no prompt to mask", "remove trainOnPrompt")
            )
        if self.streaming and self.validation_split_percentage > 0:
            errors.append(
                FieldError(
                    "validationSplitPercentage",
                    self.validation_split_percentage,
                    "a streamed dataset cannot be split by percentage",
                    "give a validation source instead",
                )
            )
        if errors:
            raise SpecRuleErrors(errors)
        return self
