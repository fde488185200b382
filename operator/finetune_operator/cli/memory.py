"""The memory fit estimate for `finetune validate` and `render`: from the model's config.json, found at the path
--model-config names, or in the model's own directory when spec.model.name is a local path. (The preflight reads it
from the Hub, a volume or s3:// in the cluster; the CLI reads nothing over the network.)"""

import json
from pathlib import Path

from ..api.spec import FineTuneJobSpec
from ..fit import FitVerdict, UnknownShape, check_fit

MODEL_CONFIG_HELP = ("the model's config.json, for the memory check (default: config.json in spec.model.name "
                     "when that is a local directory); validate exits 3 when the job does not fit")


def model_config_path(spec: FineTuneJobSpec, given: str | None) -> Path | None:
    if given:
        return Path(given)
    local = Path(spec.model.name) / "config.json"
    return local if local.is_file() else None


def memory_verdict(spec: FineTuneJobSpec, given: str | None) -> tuple[FitVerdict | None, str | None]:
    """(verdict, None), or (None, why there is none): no config to read, or one that is not a transformer's."""
    path = model_config_path(spec, given)
    if path is None:
        return None, (f"memory: no local config.json for {spec.model.name}; pass --model-config FILE for an "
                      "estimate (the preflight checks it in the cluster)")
    try:
        return check_fit(spec, json.loads(path.read_text())), None
    except (OSError, json.JSONDecodeError) as exc:
        return None, f"memory: cannot read {path}: {exc}"
    except UnknownShape as exc:
        return None, f"memory: {exc}"


def memory_text(verdict: FitVerdict) -> str:
    return f"{verdict.estimate.table(verdict.capacity_gib)}\n  {verdict.message()}"
