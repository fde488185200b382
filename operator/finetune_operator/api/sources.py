"""Where a job reads its model, tokenizer, adapter, checkpoint and data: one clean spelling of each location, and
whether it lies under a runtime's allowed prefixes.

A location is a Hub id (org/name), an absolute path on a mounted volume or an s3:// URI. A runtime's
allowedModelSources and allowedDataSources are prefixes of these, and a prefix of a string is no limit if the
string can climb out of it: `/models/../output/evil` starts with `/models/`, and so would `s3://models/../x` once an
HTTP client collapsed its dot segments. So a location holds no '.' or '..' segment, no empty one ('//', but for
s3://), no backslash and no '%' (a percent-encoded '.' or '/' a client would decode); the CRD carries the same
pattern, so the API server refuses such a location at `kubectl apply` whatever runtime the job uses. The prefix check
compares the normalised location too (`under`), so that one stored before these rules cannot climb out either.
"""

import posixpath
import re
from typing import Annotated, Any

from pydantic import AfterValidator
from pydantic.alias_generators import to_snake

from .constants import OUTPUT_MOUNT_PATH

_SEGMENT = r"([^/%\\.][^/%\\]*|\.[^/%\\.][^/%\\]*|\.\.[^/%\\]+)"  # any name but '.', '..' and ''
LOCATION_PATTERN = rf"^(s3://|/)?{_SEGMENT}(/{_SEGMENT})*/?$"
RESUME_PATTERN = rf"^(auto|never|/{_SEGMENT}(/{_SEGMENT})*/?)$"
_LOCATION = re.compile(LOCATION_PATTERN)
_OTHER_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
LOCATION_SCHEMA: dict[str, Any] = {"pattern": LOCATION_PATTERN}


def why_unclean(location: str) -> str:
    """What makes `location` unclean, in words."""
    rest = location.removeprefix("s3://")
    segments = rest.split("/")
    if "%" in location or "\\" in location:
        return "may not contain '%' or '\\' (a client could decode them into '..' or '/')"
    if any(s in (".", "..") for s in segments):
        return "may not contain '.' or '..' segments (they would climb out of the allowed prefixes)"
    return "may not contain an empty segment ('//') or be empty"


def clean_location(location: str) -> str:
    scheme = _OTHER_SCHEME.match(location)
    if scheme and scheme.group(1) != "s3":
        # Else read as a Hub id and refused seconds into the run with the Hub's "Repo id must be in the form".
        raise ValueError(f"{scheme.group(1)}:// is not a location the trainer reads: a Hub id (org/name), a path on "
                         f"a mounted volume, or s3://bucket/key; fix: write s3://{location.split('://', 1)[1]} for "
                         "object storage, or a Hub id or a path")
    if not _LOCATION.fullmatch(location):
        raise ValueError(f"{why_unclean(location)}; fix: write the location itself, e.g. /models/llama, org/name "
                         "or s3://bucket/key")
    return location


Location = Annotated[str, AfterValidator(clean_location)]


def clean_resume(resume: str) -> str:
    if resume not in ("auto", "never") and not re.fullmatch(RESUME_PATTERN, resume):
        if not resume.startswith("/"):
            raise ValueError("must be auto, never or an absolute path to a checkpoint directory; fix: write auto, "
                             f"never or e.g. {OUTPUT_MOUNT_PATH}/checkpoint-500")
        raise ValueError(f"{why_unclean(resume)}; fix: give the checkpoint's directory itself, e.g. "
                         f"{OUTPUT_MOUNT_PATH}/checkpoint-500")
    return resume


def normalised(location: str) -> str:
    """The location with its dot segments and repeated slashes resolved (s3:// kept), a trailing '/' kept."""
    scheme = "s3://" if location.startswith("s3://") else ""
    rest = location[len(scheme):]
    if not rest:
        return location
    norm = posixpath.normpath(rest)
    if norm.startswith("//"):
        norm = "/" + norm.lstrip("/")
    if rest.endswith("/") and not norm.endswith("/"):
        norm += "/"
    return scheme + norm


def under(location: str, prefixes: list[str]) -> bool:
    """True when the normalised location starts with one of `prefixes` (string prefixes, as a runtime writes them:
    end a directory with '/' so that /models does not also allow /models-other)."""
    return normalised(location).startswith(tuple(prefixes))


def own_output(path: str) -> bool:
    """A path in the job's own output directory: its checkpoints, which it may always resume from."""
    return normalised(path).startswith(OUTPUT_MOUNT_PATH + "/")


def own_checkpoint(path: str, output_uri: str | None) -> bool:
    """A checkpoint the job wrote itself: in its output directory, or under its output.uri in the bucket."""
    uri = output_uri.rstrip("/") + "/" if output_uri else None
    return own_output(path) or (uri is not None and normalised(path).startswith(uri))


# Every field that names where the trainer loads a model, its code or weights from (`[]`: each item of a list): the
# model, its tokenizer (a tokenizer can ship code too), the adapter it continues, a checkpoint it resumes from outside
# its own output directory (a checkpoint holds weights) and each GRPO reward model. The one list both checks read:
# model_sources here (the operator's, every attempt) and the admission policy's modelSources
# (render/runtime_policy.py); tests/unit/test_runtime_limits.py finds every location field of the schema in it or
# in data_sources, so a new field cannot be left out of allowedModelSources.
MODEL_SOURCE_FIELDS = ("spec.model.name", "spec.model.tokenizer", "spec.method.lora.initFrom",
                       "spec.checkpoints.resume", "spec.method.grpo.rewards[].model")
RESUME_FIELD = "spec.checkpoints.resume"  # auto and never load nothing; the job's own output is its own


def _found(node: Any, parts: list[str], at: str) -> list[tuple[str, str]]:
    if node is None:
        return []
    if not parts:
        return [(at, node)] if isinstance(node, str) else []
    part = parts[0]
    items = part.endswith("[]")
    value = getattr(node, to_snake(part.removesuffix("[]")), None)
    if not items:
        return _found(value, parts[1:], f"{at}.{part}")
    return [found for i, item in enumerate(value or [])
            for found in _found(item, parts[1:], f"{at}.{part.removesuffix('[]')}[{i}]")]


def model_sources(spec: Any) -> list[tuple[str, str]]:
    """(path in the manifest, location) of every MODEL_SOURCE_FIELDS location the spec (a validated FineTuneJobSpec,
    the effective one) sets."""
    found = []
    for field in MODEL_SOURCE_FIELDS:
        for path, location in _found(spec, field.split(".")[1:], "spec"):
            if field == RESUME_FIELD and (not location.startswith("/") or own_output(location)):
                continue
            found.append((path, location))
    return found


def data_sources(spec: Any) -> list[tuple[str, str]]:
    """(path in the manifest, path or hub dataset id) of every training and validation source but inline ones."""
    found = []
    for section in ("train", "validation"):
        for i, source in enumerate(getattr(spec.data, section) or []):
            where = f"spec.data.{section}[{i}]"
            if source.path is not None:
                found.append((f"{where}.path", source.path))
            elif source.hub is not None:
                found.append((f"{where}.hub.name", source.hub.name))
    return found
