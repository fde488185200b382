"""The documentation: a short README, a site that builds in strict mode (broken links, missing pages and stale
generated pages fail), generated reference pages, and a description for every field users can set."""

import re
import subprocess
import sys

import pytest
import yaml

from finetune_operator.api.reference import PAGES
from finetune_operator.cli.reference import cli_reference
from finetune_operator.reference_pages import PAGES as OBJECT_PAGES
from tests.conftest import ROOT

pytestmark = pytest.mark.unit
README = (ROOT / "README.md").read_text()


def test_the_readme_is_a_front_door_that_starts_with_the_two_commands():
    assert len(README.splitlines()) <= 150
    first_block = re.search(r"```bash\n(.*?)```", README, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in first_block.splitlines() if line.strip()]
    assert commands == ["./hack/quickstart.sh", "./hack/test.sh"]
    assert "./hack/test.sh" in (ROOT / ".ci" / "run").read_text()  # CI runs the README's test command


@pytest.mark.parametrize("name", [*PAGES, *OBJECT_PAGES, "cli.md", "metrics.md"])
def test_reference_pages_are_generated(name):
    from finetune_operator.controller.metrics_reference import metrics_reference

    pages = {**PAGES, **OBJECT_PAGES, "cli.md": cli_reference, "metrics.md": metrics_reference}
    page = pages[name]()
    assert (ROOT / "docs" / "reference" / name).read_text() == page, "run ./hack/generate.sh"


def _undescribed(node: dict, path: str) -> list[str]:
    missing = []
    for key, child in (node.get("properties") or {}).items():
        if not (child.get("description") or "").strip():
            missing.append(f"{path}.{key}")
        missing += _undescribed(child, f"{path}.{key}")
    if isinstance(node.get("items"), dict):
        missing += _undescribed(node["items"], f"{path}[]")
    return missing


@pytest.mark.parametrize("crd", ["finetunejob.yaml", "finetuneruntime.yaml", "clusterfinetuneruntime.yaml"])
def test_every_field_of_every_crd_has_a_description(crd):
    schema = yaml.safe_load((ROOT / "crds" / crd).read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert _undescribed(schema["properties"]["spec"], "spec") == []
    if "status" in schema["properties"]:
        assert _undescribed(schema["properties"]["status"], "status") == []


def test_every_chart_value_has_a_description():
    import json

    schema = json.loads((ROOT / "charts" / "finetunejob" / "values.schema.json").read_text())
    assert _undescribed(schema, "values") == []


def _leaves(node, path=""):
    """Every leaf path of a values document (an empty mapping or a list is a leaf)."""
    if isinstance(node, dict) and node:
        return [leaf for key, child in node.items() for leaf in _leaves(child, f"{path}.{key}".lstrip("."))]
    return [path]


def test_the_chart_values_page_shows_each_values_real_default():
    """Each default on docs/reference/chart-values.md is the one in the chart's values.yaml, which Helm uses: the
    runtime catalogue's entries differ from each other (cpuSmall maxNodes 2, gpu8x 8 and its node selector)."""
    import json
    from functools import reduce

    values = yaml.safe_load((ROOT / "charts" / "finetunejob" / "values.yaml").read_text())
    page = (ROOT / "docs" / "reference" / "chart-values.md").read_text()
    rows = re.findall(r"^\| `([^`]+)` \| (?:\\\||[^|])+ \| `(.*?)` \|", page, re.M)
    shown = {path: json.loads(default) for path, default in rows}
    for path, default in shown.items():
        assert reduce(lambda node, key: node[key], path.split("."), values) == default, path
    uncovered = [leaf for leaf in _leaves(values) if not any(leaf == p or leaf.startswith(p + ".") for p in shown)]
    assert uncovered == []
    assert shown["runtimes.catalogue.cpuSmall.maxNodes"] == 2 and shown["runtimes.catalogue.gpu8x.maxNodes"] == 8
    assert shown["runtimes.catalogue.gpu8x.nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert shown["resources.requests"] == {"cpu": "100m", "memory": "256Mi"}


def test_the_site_builds_in_strict_mode(tmp_path):
    """Every page in the nav exists, every link and anchor resolves, no page is left out of the nav."""
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "not included in the \"nav\"" not in proc.stderr, proc.stderr
    assert (tmp_path / "reference" / "spec" / "index.html").exists()


PAGES_MD = sorted([*(ROOT / "docs").rglob("*.md"), ROOT / "README.md"])
LIST_ITEM = re.compile(r"^(\s*)([-*+]|\d+[.)])\s+\S")


def lists_glued_to_a_paragraph(text: str) -> list[int]:
    """Lines where a list starts right under a paragraph line: Python-Markdown (mkdocs) needs a blank line there
    and prints the items as literal "- " text inside the paragraph; GitHub renders a list, so only the site shows
    it. Strict mode does not catch it."""
    faults, in_list, fenced, previous = [], False, False, ""
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip().startswith("```"):
            fenced = not fenced
            previous = line
            continue
        if fenced:
            continue
        if LIST_ITEM.match(line):
            glued = previous.strip() and not in_list and not previous.lstrip().startswith(("#", "|", "<", "!!!"))
            if glued:
                faults.append(number)
            in_list = True
        elif line.strip().startswith("#") or (line.strip() and not previous.strip() and not line.startswith(" ")):
            in_list = False  # a heading, or a paragraph after a blank line, ends a list
        previous = line
    return faults


def test_the_list_check_finds_a_list_glued_to_a_paragraph():
    assert lists_glued_to_a_paragraph("Text:\n- a\n- b\n") == [2]
    assert lists_glued_to_a_paragraph("Text:\n\n- a\n  more\n- b\n\n1. one\n2. two\n") == []
    assert lists_glued_to_a_paragraph("- a\n\n  indented\n- b\n") == []
    assert lists_glued_to_a_paragraph("```\nx\n- a\n```\n") == []
    assert lists_glued_to_a_paragraph("- a\n\nParagraph.\n- b\n") == [4]


@pytest.mark.parametrize("page", PAGES_MD, ids=[p.relative_to(ROOT).as_posix() for p in PAGES_MD])
def test_no_list_is_glued_to_a_paragraph(page):
    assert lists_glued_to_a_paragraph(page.read_text()) == []


CITED = re.compile(r"(?<![\w/.-])((?:tests|benchmarks|hack|examples|charts|docs|operator|trainer_image|requirements)"
                   r"/[\w./-]*\.(?:py|sh|yaml|json|md|txt|lock|png))\b")
OTHER_PROJECTS_FILES = {"examples/llama-3/README.md"}  # axolotl's, in results.md's comparison


@pytest.mark.parametrize("page", PAGES_MD, ids=[p.relative_to(ROOT).as_posix() for p in PAGES_MD])
def test_every_file_a_page_cites_exists(page):
    """A page that cites a test file, a script or an example as evidence names one that is there."""
    cited = {m.group(1) for m in CITED.finditer(page.read_text())} - OTHER_PROJECTS_FILES
    assert sorted(path for path in cited if not (ROOT / path).exists() and not any(ROOT.glob(path))) == []


# Code names a reader cannot use; the project's own issue numbers belong in results.md (what each figure answered).
INTERNAL = re.compile(r"\brender_all\b|\brender_trainer_identity\b|\bRowEncoder\b|\bissue[ -]\d+|\bissues? #\d+")


READER_PAGES = [p for p in PAGES_MD if p.name != "results.md"]


@pytest.mark.parametrize("page", READER_PAGES, ids=[p.relative_to(ROOT).as_posix() for p in READER_PAGES])
def test_no_internal_name_or_issue_number_outside_the_results(page):
    assert INTERNAL.findall(page.read_text()) == []


STEP_PAGES = sorted([*(ROOT / "docs" / "getting-started").glob("*.md"), *(ROOT / "docs" / "tasks").glob("*.md")])


def sentence_lengths(text: str) -> list[int]:
    """Words per sentence of a page's prose (code, tables, headings and images left out; a code span or a link
    counts as its words; a list item or a "1." step starts a sentence)."""
    prose, fenced = [], False
    for line in text.splitlines():
        if line.strip().startswith("```"):
            fenced = not fenced
        elif not fenced and not line.lstrip().startswith(("|", "#", "![")):
            prose.append(line)
    flat = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", re.sub(r"`[^`]*`", "X", " ".join(prose)))
    sentences = re.split(r"(?<=[.!?:])\s+(?=[A-Z`(0-9*-])|\s+-\s+|\s+\d+\.\s+", flat)
    counts = [sum(1 for word in s.split() if re.search(r"\w", word)) for s in sentences]
    return [n for n in counts if n]


def test_sentence_lengths_are_measured_as_a_reader_meets_them():
    assert sentence_lengths("One two three. Four five:\n\n- six seven\n- eight\n\n```\nnot prose at all\n```\n") \
        == [3, 2, 2, 1]


@pytest.mark.parametrize("page", STEP_PAGES, ids=[p.relative_to(ROOT).as_posix() for p in STEP_PAGES])
def test_getting_started_and_task_pages_are_short_sentences(page):
    """Steps a reader follows, in sentences they read once: the why belongs on the concepts pages."""
    lengths = sentence_lengths(page.read_text())
    assert sum(lengths) / len(lengths) <= 16 and max(lengths) <= 35, (sum(lengths) / len(lengths), max(lengths))
