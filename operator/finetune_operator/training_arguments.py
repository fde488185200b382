"""The real set of TrainingArguments field names, read from the installed transformers (never a copied list).

Importing transformers.TrainingArguments imports torch (seconds, hundreds of MB), which the operator must not pay.
So the dataclass fields are read from the installed `transformers/training_args.py` with `ast`; a unit test
checks this equals `dataclasses.fields(TrainingArguments)` so the two can never drift apart.
"""

import ast
import functools
import importlib.util
from pathlib import Path


class TransformersNotInstalled(RuntimeError):
    """transformers is a dependency of the operator; without it extraArgs cannot be checked."""


@functools.cache
def training_argument_names() -> frozenset[str]:
    """Init-field names of transformers.TrainingArguments in the installed transformers."""
    spec = importlib.util.find_spec("transformers")
    if spec is None or spec.origin is None:
        raise TransformersNotInstalled("transformers is not installed; install requirements/operator.txt")
    source = Path(spec.origin).with_name("training_args.py").read_text(encoding="utf-8")
    return frozenset(_dataclass_init_fields(ast.parse(source), "TrainingArguments"))


def _dataclass_init_fields(module: ast.Module, class_name: str) -> list[str]:
    for node in module.body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            return [
                stmt.target.id
                for stmt in node.body
                if isinstance(stmt, ast.AnnAssign)
                and isinstance(stmt.target, ast.Name)
                and not _is_classvar(stmt.annotation)
                and not _init_false(stmt.value)
            ]
    raise TransformersNotInstalled(f"class {class_name} not found in transformers/training_args.py")


def _is_classvar(annotation: ast.expr) -> bool:
    return "ClassVar" in ast.unparse(annotation)


def _init_false(value: ast.expr | None) -> bool:
    if not isinstance(value, ast.Call):
        return False
    return any(kw.arg == "init" and isinstance(kw.value, ast.Constant) and kw.value.value is False
               for kw in value.keywords)
