"""Measures the exercise checks on the second held-out catalogue (heldout_second.py): not a test.

Run from the repository's root:

    python -m tests.exercises.measure_heldout_second [--seeds K] [--show]

It prints how many wrong answers are rejected, the false passes (by id, the entries flagged
"rare" or "hole" apart), the share of rejected answers whose diagnosis names the mistake, the
misleading diagnoses, how many of an exercise's cases show each mistake, and a table per
exercise and per chapter. With --seeds K the cases are also drawn from K other seeds (what the
grader's held-out probes do), and an answer's false passes are counted over all the draws.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

import xenith_edu.exercises as ex

from .heldout_second import HELDOUT_SECOND, Wrong
from .test_heldout import diagnosis
from .test_heldout_second import LIVE, RETIRED

__test__ = False  # a measurement, not a test: pytest does not collect it


@dataclass(frozen=True)
class Verdict:
    """One entry judged on one draw of the cases."""

    entry: Wrong
    rejected: bool
    named: bool  # the diagnosis matches the entry's `want`
    misleading: bool  # the diagnosis matches the entry's `absent`
    showing: int  # how many of the cases, each judged alone, reject the answer
    cases: int
    how: str  # what the verdict rests on: "raised", "form" (shape, dtype), "values" or ""
    message: str


def judge(entry: Wrong, rng: np.random.Generator | None = None) -> Verdict:
    """The check's verdict on the entry's function, on the notebook's cases or on rng's."""
    spec = ex.SPECS[entry.exercise]
    calls = [(case, ex.run(entry.fn, case.args)) for case in spec.inputs(rng)]
    result = ex.judge(spec, calls)
    cases = [(c, o) for c, o in calls if not c.probe]
    showing = sum(not ex.judge(spec, [call]).passed for call in cases)
    text = diagnosis(result) if not result.passed else ""
    named = not result.passed and re.search(entry.want, text) is not None
    misleading = (not result.passed and entry.absent is not None
                  and re.search(entry.absent, text) is not None)
    return Verdict(entry, not result.passed, named, misleading, showing, len(cases),
                   _how(result), result.message)


def _how(result: ex.CheckResult) -> str:
    if result.passed:
        return ""
    first = result.message.splitlines()[1:2]
    text = first[0].strip() if first else ""
    if text.startswith("your function raised"):
        return "raised"
    if " is wrong:" in text or " NaN" in text or " inf" in text:
        return "values"
    return "form"


def _pct(a: int, b: int) -> str:
    return f"{a} of {b} ({a / b:.0%})" if b else f"{a} of 0"


def _kind(entry: Wrong) -> str:
    return "hole" if "hole" in entry.flags else "rare" if "rare" in entry.flags else "plain"


def report(verdicts: list[Verdict], show: bool = False) -> None:
    """Prints the measurement of one draw of the cases (the notebook's)."""
    chapters = {e.exercise: ex.SPECS[e.exercise].chapter for e in LIVE}
    print(f"{len(verdicts)} wrong answers, {len(set(chapters))} exercises, "
          f"{len(set(chapters.values()))} chapters")
    gone = len(HELDOUT_SECOND) - len(LIVE)
    print(f"left out: {gone} entries of exercises the book no longer asks "
          f"({', '.join(sorted(RETIRED))})")
    rejected = [v for v in verdicts if v.rejected]
    print(f"rejected: {_pct(len(rejected), len(verdicts))}")
    for kind in ("plain", "rare", "hole"):
        group = [v for v in verdicts if _kind(v.entry) == kind]
        passes = [v.entry.id for v in group if not v.rejected]
        print(f"  false passes among {kind} entries: {_pct(len(passes), len(group))}"
              + (": " + ", ".join(passes) if passes else ""))
    named = [v for v in rejected if v.named]
    print(f"right diagnosis (on rejected): {_pct(len(named), len(rejected))}")
    clean = [v for v in named if not v.misleading]
    print(f"  ... and nothing misleading with it: {_pct(len(clean), len(rejected))}")
    for how in ("values", "form", "raised"):
        group = [v for v in rejected if v.how == how]
        named_here = sum(v.named for v in group)
        print(f"  rejected on {how}: {len(group)}, named {_pct(named_here, len(group))}")
    mis = [v for v in rejected if v.misleading]
    print(f"misleading diagnoses: {len(mis)}" + (": " + ", ".join(v.entry.id for v in mis)
                                                 if mis else ""))
    thin = [f"{v.entry.id} ({v.showing}/{v.cases})" for v in verdicts if v.showing <= 1]
    print(f"shown by at most one case of the draw: {len(thin)}"
          + (": " + ", ".join(thin) if thin else ""))
    _table(verdicts, lambda v: v.entry.exercise, "exercise", chapters)
    _table(verdicts, lambda v: chapters[v.entry.exercise], "chapter", None)
    if show:
        for v in verdicts:
            if not v.named:
                print(f"\n--- {v.entry.id} (wants /{v.entry.want}/)\n{v.message}")


def _table(verdicts: list[Verdict], key, title: str, chapters: dict | None) -> None:
    rows: dict[str, list[Verdict]] = defaultdict(list)
    for v in verdicts:
        rows[key(v)].append(v)
    width = max(len(k) for k in rows) + 2
    extra = f"{'chapter':<12}" if chapters else ""
    print(f"\n{title:<{width}}{extra}{'n':>3} {'rejected':>9} {'named':>6} {'misled':>7} "
          f"{'passed':>7}")
    for k, vs in rows.items():
        ch = f"{chapters[k]:<12}" if chapters else ""
        rej = sum(v.rejected for v in vs)
        print(f"{k:<{width}}{ch}{len(vs):>3} {rej:>9} {sum(v.named for v in vs):>6} "
              f"{sum(v.misleading for v in vs):>7} {len(vs) - rej:>7}")


def seeds_report(k: int) -> None:
    """False passes and diagnosis rates over K more draws of the cases (seeds 1 to K)."""
    passes: dict[str, int] = defaultdict(int)
    named = rejected = 0
    for seed in range(1, k + 1):
        for entry in LIVE:
            v = judge(entry, np.random.default_rng(seed))
            rejected += v.rejected
            named += v.named
            if not v.rejected:
                passes[entry.id] += 1
    total = k * len(LIVE)
    print(f"\nover {k} more draws of the cases: rejected {_pct(rejected, total)}, right "
          f"diagnosis {_pct(named, rejected)}")
    flags = {e.id: _kind(e) for e in LIVE}
    for kind in ("plain", "rare", "hole"):
        ids = [f"{i} ({n} of {k})" for i, n in passes.items() if flags[i] == kind]
        print(f"  false passes among {kind} entries: {len(ids)}"
              + (": " + ", ".join(ids) if ids else ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=0, help="more draws of the cases")
    parser.add_argument("--show", action="store_true", help="print the verdicts not named")
    args = parser.parse_args(argv)
    report([judge(e) for e in LIVE], args.show)
    if args.seeds > 0:
        seeds_report(args.seeds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
