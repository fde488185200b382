"""How a page's commands are read and its shown output compared (tests/support/doc_commands.py), which the
getting-started tests rely on: a drift must fail, run-to-run values must not."""

import pytest

from tests.support import doc_commands

PAGE = """# A page

1. Do this:

    ```bash
    kubectl create namespace team-a
    ```

    ```text
    namespace/team-a created
    ```

2. Then this, which prints nothing shown:

    ```bash
    kubectl apply -f - <<'EOF'
    kind: X
    EOF
    ```

```yaml
not: a step
```

```bash
kubectl get ftj
```

Some prose between a command and its output.

```text
NAME   LOSS
```
"""


def test_steps_are_the_bash_blocks_with_the_text_block_after_each(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(PAGE)
    steps = doc_commands.steps(page)
    assert [s.commands for s in steps] == ["kubectl create namespace team-a\n",
                                           "kubectl apply -f - <<'EOF'\nkind: X\nEOF\n", "kubectl get ftj\n"]
    assert [s.expected for s in steps] == ["namespace/team-a created\n", None, "NAME   LOSS\n"]
    assert [s.line for s in steps] == [5, 15, 25]  # the opening fences


def test_a_section_is_the_blocks_under_its_heading_with_their_lines_in_the_page(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# T\n\n## One\n\n```bash\na\n```\n\n## Two\n\n```bash\nb\n```\n\n```text\nB\n```\n"
                    "\n## Three\n\n```bash\nc\n```\n")
    assert [(s.commands, s.expected, s.line) for s in doc_commands.steps(page, "Two")] == [("b\n", "B\n", 11)]
    with pytest.raises(ValueError):
        doc_commands.steps(page, "Four")


@pytest.mark.parametrize(("expected", "actual"), [
    ("tiny-sft   Succeeded   1/1   0   100   11.84   0m00s   Succeeded   2m5s",
     "tiny-sft Succeeded 1/1 0 100 5.2741 0m03s Succeeded 31s"),
    ("LAST DEPLOYED: ...", "LAST DEPLOYED: Fri Nov 27 06:26:58 2026"),
    ("NAME: x\n...\nSTATUS: deployed", "NAME: x\nA: 1\nB: 2\nSTATUS: deployed"),
    ("NAME: x\n...\nSTATUS: deployed", "NAME: x\nSTATUS: deployed"),
    ("at 2026-11-27T06:26:58Z, 12:01:02", "at 2025-01-01T00:00:00Z, 23:59:59"),
], ids=["decimals-and-ages", "rest-of-line", "lines-elided", "nothing-elided", "timestamps"])
def test_values_that_change_from_run_to_run_match(expected, actual):
    assert doc_commands.mismatch(expected, actual) is None


@pytest.mark.parametrize(("expected", "actual"), [
    ("tiny-sft   Succeeded   1/1", "tiny-sft   Failed   1/1"),
    ("tiny-sft   Succeeded   1/1   0   100", "tiny-sft   Succeeded   1/1   0   41"),  # integers are exact
    ("NODES 1/1", "NODES 0/1"),
    ("LOSS 11.84", "LOSS 11"),  # a decimal is not an integer
    ("AGE 2m5s", "AGE 2"),
    ("namespace/team-a created", "namespace/team-a created\nextra line"),
    ("namespace/team-a created\nrolebinding created", "namespace/team-a created"),
    ("NAME: x\n...\nSTATUS: deployed", "NAME: x\nA: 1\nSTATUS: failed"),
], ids=["word", "integer", "fraction", "decimal-kind", "age-kind", "extra-line", "missing-line", "after-elision"])
def test_a_drift_is_a_mismatch(expected, actual):
    assert doc_commands.mismatch(expected, actual) is not None


@pytest.mark.parametrize(("commands", "reads"), [
    ("kubectl events -n team-a --for ftj/tiny-sft", True),
    ("kubectl get ftj -n team-a", True),
    ("# what it says\nkubectl describe ftj/tiny-sft -n team-a\n", True),
    ("kubectl wait ftj/tiny-sft -n team-a --for=jsonpath='{.status.phase}'=Succeeded --timeout=15m\n"
     "kubectl get ftj -n team-a", False),
    ("kubectl apply -f job.yaml", False),
    ("kubectl get ftj -n team-a; kubectl delete ftj tiny-sft -n team-a", False),
    ("kubectl get ftj -n team-a && kubectl delete ftj tiny-sft -n team-a", False),
    ("kubectl get ftj -n team-a -o name | xargs kubectl delete", False),
    ("kubectl get ftj $(kubectl create ns x)", False),
    ("kubectl get ftj -n team-a > out.txt", False),
    ("kubectl get ftj tiny-sft -n team-a -o jsonpath='{.status.phase}'", True),
    ("kubectl getter", False),
    ("", False),
])
def test_only_blocks_of_kubectl_reads_are_read_again(commands, reads):
    assert doc_commands.only_reads(commands) is reads
