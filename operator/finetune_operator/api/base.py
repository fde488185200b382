"""The base for every API model: YAML uses camelCase, unknown keys are errors, values are checked on assignment."""

from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, GetJsonSchemaHandler
from pydantic.alias_generators import to_camel


class ApiModel(BaseModel):
    """extra="forbid" turns a typo such as `numNode` into an error instead of a silently ignored key."""

    model_config = ConfigDict(
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        validate_assignment=True,
        use_attribute_docstrings=False,
        frozen=False,
        allow_inf_nan=False,  # NaN and Infinity have no JSON spelling: refused with "a finite number"
        strict=True,  # as the CRD schema: 5.0 is not an integer and "8" is not a number
    )



class _YamlFalseWord:
    """Marks an enum whose word YAML 1.1 reads as a boolean: the CRD generator (crd.py) gives that field a schema
    that takes `false` too, since the apiserver sees what kubectl's YAML parser made of `off` or `no`."""

    def __init__(self, word: str):
        self.word = word

    def __get_pydantic_json_schema__(self, core_schema: Any, handler: GetJsonSchemaHandler) -> dict[str, Any]:
        schema: dict[str, Any] = handler(core_schema)
        schema[YAML_FALSE_KEY] = self.word
        return schema


YAML_FALSE_KEY = "x-finetune-yaml-false"
_T = TypeVar("_T")


def _false_as(word: str) -> Callable[[Any], Any]:
    return lambda value: word if value is False else value


# Enums with `off` or `no` among their words, which unquoted YAML 1.1 (kubectl, PyYAML) reads as false: a boolean
# false is taken as that word instead of being refused with a message that tells the user to write what they wrote.
FalseIsOff = Annotated[_T, BeforeValidator(_false_as("off")), _YamlFalseWord("off")]
FalseIsNo = Annotated[_T, BeforeValidator(_false_as("no")), _YamlFalseWord("no")]
