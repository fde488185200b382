"""The chart's Grafana dashboard, drawn from its own queries over the operator's real metrics.

Grafana is not run here: it is AGPL-licensed (this project does not use it) and neither a Go module we may build nor
a Debian package. What a Grafana panel shows is its PromQL queries' results, so those are computed the way
Grafana gets them: a Scraper reads the operator's /metrics like a Prometheus scrape loop, promql-eval
(hack/promql: Prometheus' exposition parser and PromQL engine) runs each panel's queries as range queries, and
`draw` lays the panels out on the dashboard's own 24-column grid with matplotlib (time series and stats, units,
legends from legendFormat, Grafana's dark theme)."""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

from tests.conftest import ROOT

DASHBOARD = ROOT / "charts" / "finetunejob" / "dashboards" / "finetunejob-operator.json"
BACKGROUND, PANEL, TEXT, GRID = "#111217", "#181b1f", "#ccccdc", "#2c3235"
# Grafana's classic palette (the first sixteen): a series without a fixed colour takes the next one no override took.
PALETTE = ["#7EB26D", "#EAB839", "#6ED0E0", "#EF843C", "#E24D42", "#1F78C1", "#BA43A9", "#705DA0", "#508642",
           "#CCA300", "#447EBC", "#C15C17", "#890F02", "#0A437C", "#6D1F62", "#584477"]


class Scraper:
    """Scrapes a /metrics URL every `every` seconds on a thread, as Prometheus would, until stopped."""

    def __init__(self, url: str, every: float = 1.0):
        self.url, self.every = url, every
        self.scrapes: list[dict] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Scraper:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = time.time()
            try:
                text = urllib.request.urlopen(self.url, timeout=5).read().decode()
                self.scrapes.append({"t": int(started * 1000), "text": text})
            except OSError as exc:
                self.failures.append(f"{started:.0f}: {exc}")
            self._stop.wait(max(0.0, self.every - (time.time() - started)))


def evaluate(promql_eval: Path, scrapes: list[dict], queries: list[str], step: float) -> dict[str, dict]:
    """query -> {"series": [...], "error": ...}: each query as a range query over the scrapes' span."""
    request = {"scrapes": scrapes, "queries": queries, "start": scrapes[0]["t"], "end": scrapes[-1]["t"],
               "stepSeconds": step}
    proc = subprocess.run([str(promql_eval)], input=json.dumps(request), capture_output=True, text=True,
                          timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"promql-eval failed ({proc.returncode}): {proc.stderr[-2000:]}")
    results = json.loads(proc.stdout)["results"]
    for series in (s for r in results for s in r["series"]):
        series["points"] = [(t, float(v)) for t, v in series["points"]]  # "NaN", "+Inf" as Prometheus' API
    return {r["query"]: r for r in results}


def panel_queries(dashboard: dict) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def legend(fmt: str, metric: dict) -> str:
    """Grafana's legendFormat: {{label}} replaced by the series' label value."""
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: metric.get(m.group(1), ""), fmt) or json.dumps(metric)


def with_unit(value: float, unit: str) -> str:
    if unit == "s":
        return f"{value * 1000:.0f} ms" if 0 < abs(value) < 1 else f"{value:.3g} s"
    if unit == "reqps":
        return f"{value:.3g} req/s"
    return f"{value:.3g}"


def fixed_colours(panel: dict) -> dict[str, str]:
    """Series name -> the colour a panel's overrides fix for it (Grafana's byName matcher, fixed colour mode)."""
    colours = {}
    for override in panel.get("fieldConfig", {}).get("overrides", []):
        if override["matcher"]["id"] == "byName":
            for prop in override["properties"]:
                if prop["id"] == "color" and prop["value"].get("mode") == "fixed":
                    colours[override["matcher"]["options"]] = prop["value"]["fixedColor"]
    return colours


def series_colours(panel: dict, names: list[str]) -> dict[str, str]:
    """As Grafana colours a panel's series: a fixed colour where an override gives one, else the palette's next
    colour that no override took."""
    fixed = fixed_colours(panel)
    free = iter([c for c in PALETTE if c not in fixed.values()] * len(names))
    return {name: fixed.get(name) or next(free) for name in names}


def draw(dashboard: dict, results: dict[str, dict], path: Path, title_suffix: str = "") -> None:
    """The dashboard as Grafana lays it out: gridPos columns of 1/24 of the width, rows of 30 px."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in dashboard["panels"])
    width_px, row_px, header_px = 1600, 30, 40
    height_px = rows * row_px + header_px
    fig = plt.figure(figsize=(width_px / 100, height_px / 100), dpi=100, facecolor=BACKGROUND)
    fig.text(8 / width_px, 1 - 26 / height_px, dashboard["title"] + title_suffix, color=TEXT, fontsize=14,
             weight="bold")
    pad = 4 / width_px
    for panel in dashboard["panels"]:
        g = panel["gridPos"]
        left, right = g["x"] / 24 + pad, (g["x"] + g["w"]) / 24 - pad
        top = 1 - (header_px + g["y"] * row_px) / height_px - pad
        bottom = 1 - (header_px + (g["y"] + g["h"]) * row_px) / height_px + pad
        frame = fig.add_axes((left, bottom, right - left, top - bottom), facecolor=PANEL)
        frame.set_xticks([]), frame.set_yticks([])
        for spine in frame.spines.values():
            spine.set_color(GRID)
        frame.text(0.012, 0.95, panel["title"], transform=frame.transAxes, color=TEXT, fontsize=10,
                   weight="bold", va="top")
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "short")
        lines = [(legend(t.get("legendFormat", ""), s["metric"]), s["points"])
                 for t in panel.get("targets", []) for s in results[t["expr"]]["series"]]
        if panel["type"] == "stat":
            value = sum(points[-1][1] for _, points in lines) if lines else None
            frame.text(0.5, 0.45, "No data" if value is None else with_unit(value, unit),
                       transform=frame.transAxes, ha="center", va="center", fontsize=34 if lines else 18,
                       color=PALETTE[0] if lines else TEXT, weight="bold")
            if lines:
                frame.text(0.5, 0.12, lines[0][0], transform=frame.transAxes, ha="center", color=TEXT, fontsize=9)
            continue
        legend_rows = -(-len(lines) // 8) if lines else 0  # Grafana's list legend below the plot
        low = 0.12 + 0.075 * legend_rows
        plot = fig.add_axes((left + 0.04 * (right - left), bottom + low * (top - bottom),
                             0.93 * (right - left), (0.84 - low) * (top - bottom)), facecolor=PANEL)
        plot.tick_params(colors=TEXT, labelsize=8)
        plot.grid(color=GRID, linewidth=0.6)
        for spine in plot.spines.values():
            spine.set_visible(False)
        if not lines:
            plot.set_xticks([]), plot.set_yticks([])
            plot.text(0.5, 0.5, "No data", transform=plot.transAxes, ha="center", va="center", color=TEXT,
                      fontsize=14)
            continue
        colours = series_colours(panel, [name for name, _ in sorted(lines)])
        for name, points in sorted(lines):
            times = [datetime.fromtimestamp(t / 1000, tz=UTC) for t, _ in points]
            plot.plot(times, [v for _, v in points], color=colours[name], linewidth=1.6, label=name)
        plot.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S", tz=UTC))
        plot.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos, unit=unit: with_unit(v, unit)))
        plot.set_ylim(bottom=0)
        plot.legend(loc="upper left", bbox_to_anchor=(0, -0.1), ncol=8, frameon=False, labelcolor=TEXT,
                    fontsize=8, handlelength=1.2, columnspacing=1.2)
    fig.savefig(path, facecolor=BACKGROUND)
    plt.close(fig)
