"""The base for every API model: YAML uses camelCase, unknown keys are errors, values are checked on assignment."""

from pydantic import BaseModel, ConfigDict
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
