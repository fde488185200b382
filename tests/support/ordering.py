"""The order test files start in under pytest-xdist (a file is one unit of work, --no-loadscope-reorder keeps this
order): the run is CPU-bound on 2 cores, and the files differ in what they wait for.

- Training files (e2e, images) keep the cores busy: trainer processes, containers.
- Cluster files mostly wait on a control plane (watches, pod phases, timeouts) and use little CPU.
Run either kind alone and the cores idle (all cluster: workers waiting) or thrash (all training: three trainers
and their control planes on two cores). So the two kinds are merged in proportion, each longest first, and the
unit files (short, CPU-bound) come last, where they fill the workers' gaps as the long files end."""

from __future__ import annotations

TRAINING_TIERS = ("e2e", "images")
WAITING_TIERS = ("cluster",)
TIERS = (*TRAINING_TIERS, *WAITING_TIERS, "unit")  # the folders under tests/, each a pytest marker
# What a file not recorded yet (tests/durations.json) is expected to take: its tier's typical file.
TYPICAL_SECONDS = {"e2e": 100, "images": 50, "cluster": 40, "unit": 5}


def tier_of(path: str) -> str:
    """The tier of a test file's path relative to the root (tests/<tier>/...), or "" outside them."""
    parts = path.split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" and parts[1] in TIERS else ""


def start_order(files: dict[str, tuple[str, float]]) -> list[str]:
    """files: path -> (tier, expected seconds). Training and cluster files merged so that each kind's share of its
    own total stays level along the run; then the rest (unit). Within a kind, longest first."""
    def longest_first(tiers: tuple[str, ...] | None) -> list[str]:
        chosen = [p for p, (tier, _) in files.items()
                  if (tier in tiers if tiers is not None else tier not in TRAINING_TIERS + WAITING_TIERS)]
        return sorted(chosen, key=lambda p: (-files[p][1], p))

    kinds = [longest_first(TRAINING_TIERS), longest_first(WAITING_TIERS)]
    totals = [sum(files[p][1] for p in kind) or 1.0 for kind in kinds]
    taken = [0.0, 0.0]
    order: list[str] = []
    while kinds[0] or kinds[1]:
        # The kind furthest behind its own total goes next (ties: training, which keeps the cores busy).
        k = min((k for k in (0, 1) if kinds[k]), key=lambda k: taken[k] / totals[k])
        path = kinds[k].pop(0)
        taken[k] += files[path][1]
        order.append(path)
    return order + longest_first(None)
