"""docs/reference/metrics.md, generated from the operator's own Prometheus collectors (`./hack/generate.sh`), with
the dashboard panels that read each metric (charts/finetunejob/dashboards/)."""

import json
import re
import sys
from pathlib import Path
from typing import Any

from ..api.status import PHASES
from . import metrics
from .observed import WAITING_REASONS

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = ROOT / "charts" / "finetunejob" / "dashboards" / "finetunejob-operator.json"
LABEL_VALUES = {("finetunejob_jobs", "phase"): PHASES, ("finetunejob_jobs_waiting", "reason"): WAITING_REASONS}


def _panels(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, query) of every target, rows' nested panels included."""
    out = []
    for panel in dashboard.get("panels", []):
        for inner in [panel, *panel.get("panels", [])]:
            out += [(inner.get("title", ""), t.get("expr", "")) for t in inner.get("targets", [])]
    return out


def metrics_reference() -> str:
    panels = _panels(json.loads(DASHBOARD.read_text())) if DASHBOARD.exists() else []
    lines = ["# Metrics", "",
             "The operator's Prometheus metrics on `/metrics` (chart value `metrics.port`, 8080), generated from its "
             "collectors (`finetune_operator/controller/metrics.py`) by `./hack/generate.sh`. Counters are this "
             "replica's since it started (a new leader starts from zero: use `increase()`/`rate()`); gauges are "
             "the leader's view. The dashboard panels that read each metric are listed with it.", "",
             "| metric | type | labels | description | dashboard panels |", "|---|---|---|---|---|"]
    for collector in metrics.COLLECTORS:
        family = next(iter(collector.describe()))
        name = family.name + ("_total" if family.type == "counter" else "")
        labels = ", ".join(
            f"`{label}`" + (f" ({', '.join(LABEL_VALUES[(family.name, label)])})"
                            if (family.name, label) in LABEL_VALUES else "")
            for label in collector._labelnames)  # prometheus_client has no public accessor for them
        reads = re.compile(rf"\b{family.name}(_bucket|_sum|_count|_total)?\b")
        used = sorted({title for title, expr in panels if reads.search(expr)})
        kind = family.type + (" (`_bucket`, `_sum`, `_count`)" if family.type == "histogram" else "")
        lines.append(f"| `{name}` | {kind} | {labels} | {family.documentation} | {', '.join(used)} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    (Path(sys.argv[1]) / "docs" / "reference" / "metrics.md").write_text(metrics_reference())
