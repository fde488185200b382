"""The chart's Grafana dashboard tells its series apart: every phase and every reason the operator can count has a
colour of its own in its panel (Grafana's palette, by series order, gave AttemptRefused and Unschedulable the same
green, Error and Stalled the same yellow)."""

import json

import pytest

from finetune_operator.api.status import PHASES
from finetune_operator.controller.metrics import RESTART_REASONS
from finetune_operator.controller.observed import WAITING_REASONS
from tests.support.dashboard import DASHBOARD, PALETTE, fixed_colours, series_colours

PANELS = {p["title"]: p for p in json.loads(DASHBOARD.read_text())["panels"]}
LABEL_VALUES = {"FineTuneJobs by phase": PHASES, "Gang restarts by reason": RESTART_REASONS,
                "Pending jobs by why they wait": WAITING_REASONS}


@pytest.mark.parametrize("title", LABEL_VALUES)
def test_every_value_of_a_panels_label_has_a_colour_of_its_own(title):
    colours = fixed_colours(PANELS[title])
    assert sorted(colours) == sorted(LABEL_VALUES[title])
    assert len(set(colours.values())) == len(colours), colours


def test_the_drawing_uses_the_fixed_colours_and_gives_others_free_ones():
    panel = PANELS["Gang restarts by reason"]
    names = [*RESTART_REASONS, "StorageUnavailable", "UploadFailed"]  # a trainer may name its own reason
    colours = series_colours(panel, names)
    assert {n: colours[n] for n in RESTART_REASONS} == fixed_colours(panel)
    assert len(set(colours.values())) == len(names) and len(PALETTE) >= len(names)
