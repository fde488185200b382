"""Reading FineTuneJob manifests from YAML files, with errors that name the file and line."""

import re
import sys
from pathlib import Path
from typing import Any

import yaml


class Loader(yaml.SafeLoader):
    """PyYAML follows YAML 1.1, where `2e-5` is a string; kubectl reads it as a number (YAML 1.2), and so do we."""


Loader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(
    r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"), list("-+0123456789."))


def load_yaml(text: str) -> Any:
    return yaml.load(text, Loader=Loader)  # noqa: S506 - a SafeLoader subclass


STDIN = "-"


class ManifestError(Exception):
    """The file cannot be read or is not valid YAML (as opposed to a valid YAML with a bad spec)."""


def load_documents(path: str) -> list[dict[str, Any]]:
    """Every non-empty YAML document in `path` ('-': standard input, e.g. `kubectl get ftj x -o yaml | ...`)."""
    try:
        text = sys.stdin.read() if path == STDIN else Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ManifestError(f"{path}: cannot read: {exc.strerror}") from exc
    try:
        docs = [d for d in yaml.load_all(text, Loader=Loader) if d is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else path
        raise ManifestError(f"{where}: not valid YAML: {getattr(exc, 'problem', exc)}") from exc
    if not docs:
        raise ManifestError(f"{path}: no YAML document found")
    for i, doc in enumerate(docs):
        if not isinstance(doc, dict):
            raise ManifestError(f"{path}: document {i + 1} is a {type(doc).__name__}, expected a FineTuneJob mapping")
    return docs


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the config files in the ConfigMap) print as readable literal blocks."""


def _str_representer(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str_representer)


def dump_documents(objects: list[dict[str, Any]]) -> str:
    """A YAML stream, like `helm template`; the dumper quotes any string that could be misread."""
    return "".join("---\n" + yaml.dump(o, Dumper=_Dumper, sort_keys=False, width=120) for o in objects)
