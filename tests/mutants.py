"""`make mutants`: run mutmut on the package modules within a time budget, then report.

The report gives, module by module, the mutants killed, survived, equivalent (listed with a
reason in tests/mutants_equivalent.toml), timed out and not yet run, and the score
(killed + timeout) / (all run - equivalent). See the README, "Mutation testing".

    python tests/mutants.py                       # every module of [tool.mutmut], resumes
    python tests/mutants.py gradcheck checkpoint  # these modules only, measured afresh
    python tests/mutants.py model.config          # a stem two modules share: its dotted path
    python tests/mutants.py --report              # the report of the last run, no run
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EQUIVALENT = ROOT / "tests" / "mutants_equivalent.toml"
TARGET = 95.0  # percent of non-equivalent mutants killed, in every module

if sys.version_info >= (3, 11):
    import tomllib
else:  # mutmut itself depends on toml there
    import toml as tomllib  # type: ignore[no-redef]


def _load_toml(path: Path) -> dict:
    if sys.version_info >= (3, 11):
        return tomllib.loads(path.read_text("utf-8"))
    return tomllib.load(str(path))


def configured_modules() -> dict[str, Path]:
    """The modules that [tool.mutmut] only_mutate lists, by name: the file's stem (gradcheck,
    data, transformer, ...), or its dotted path under xenith_edu where two stems are alike."""
    paths = [Path(p) for p in _load_toml(ROOT / "pyproject.toml")["tool"]["mutmut"]["only_mutate"]]
    stems = Counter(p.stem for p in paths)
    return {p.stem if stems[p.stem] == 1 else ".".join(p.with_suffix("").parts[1:]): p
            for p in paths}


def dotted(path: Path) -> str:
    """xenith_edu/tools/gradcheck.py -> xenith_edu.tools.gradcheck, the prefix of its mutants."""
    return ".".join(path.with_suffix("").parts)


def path_of(mutant: str) -> Path | None:
    """The source file of a mutant ('xenith_edu.tools.gradcheck.x_rel_error__mutmut_3'), or
    None if no configured module holds it."""
    for path in configured_modules().values():
        if mutant.startswith(dotted(path) + "."):
            return path
    return None


def _statuses(modules: list[str]) -> dict[str, str]:
    """The status of every mutant of `modules` that mutmut has recorded ({} before a run)."""
    os.chdir(ROOT)
    from mutmut.mutation.data import SourceFileMutationData
    from mutmut.stats import status_by_exit_code

    known, out = configured_modules(), {}
    for mod in modules:
        data = SourceFileMutationData(path=known[mod])
        data.load()
        out.update({k: status_by_exit_code[c] for k, c in data.exit_code_by_key.items()})
    return out


UNKILLED = ("survived", "no tests", "suspicious", "segfault")


def _mutmut(names: list[str], deadline: float, jobs: int) -> bool:
    """One `mutmut run` (of `names`, else of every mutant without a result) until `deadline`.

    Returns False if the budget ran out. Stopping is mutmut's own Ctrl-C: results so far are
    kept, and the next run resumes.
    """
    cmd = [sys.executable, "-m", "mutmut", "run", "--max-children", str(jobs), *names]
    shown = cmd[:6] + ([f"<{len(names)} mutants>"] if len(names) > 4 else names)
    print("$", " ".join(shown), flush=True)
    proc = subprocess.Popen(cmd, cwd=ROOT)
    try:
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        return True
    except subprocess.TimeoutExpired:
        print("\nmutants: time budget used up: stopping mutmut (a new run resumes where this "
              "one stopped)", flush=True)
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        return False
    except KeyboardInterrupt:
        proc.wait()
        raise


def _not_equivalent(names: list[str]) -> list[str]:
    """The mutants of `names` that tests/mutants_equivalent.toml does not cover."""
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    entries, rules = load_equivalent(), load_rules()
    out = []
    for name in names:
        path = path_of(name)
        if equivalence(name, get_diff_for_mutant(name, path=path), entries, rules) is None:
            out.append(name)
    return out


def run_mutmut(modules: list[str], fresh: bool, budget: float, jobs: int) -> None:
    """Run the mutants of `modules` within `budget` seconds.

    fresh: every mutant of these modules again. Otherwise resume: the mutants without a result,
    then the earlier survivors again (a test added since may kill them; mutmut keeps a result
    until the function itself changes). Which tests call which function is always collected
    anew (mutmut's incremental collection misses calls into functions added since).
    """
    (ROOT / "mutants" / "mutmut-stats.json").unlink(missing_ok=True)
    deadline = time.monotonic() + budget
    if fresh:
        known = configured_modules()
        _mutmut([f"{dotted(known[m])}.*" for m in modules], deadline, jobs)
        return
    before = _statuses(modules)
    if not _mutmut([], deadline, jobs):
        return
    again = [k for k in _not_equivalent(sorted(k for k, s in _statuses(modules).items()
                                              if s in UNKILLED and before.get(k) in UNKILLED))]
    if again:
        print(f"mutants: {len(again)} earlier survivors again, with the current tests")
        _mutmut(again, deadline, jobs)


def load_equivalent() -> list[dict]:
    """The equivalent mutants: each entry has `id`, `mutated` (the changed line) and `reason`."""
    if not EQUIVALENT.exists():
        return []
    entries = _load_toml(EQUIVALENT).get("equivalent", [])
    for e in entries:
        missing = {"id", "mutated", "reason"} - set(e)
        if missing or not str(e.get("reason", "")).strip():
            raise SystemExit(f"{EQUIVALENT.name}: entry {e.get('id', e)} needs id, mutated and a "
                             f"non-empty reason (missing: {sorted(missing) or ['reason']})")
    return entries


def load_rules() -> dict[str, str]:
    """The rules of the equivalents file that cover whole classes of mutants: name -> reason."""
    if not EQUIVALENT.exists():
        return {}
    return {k: v["reason"] for k, v in _load_toml(EQUIVALENT).get("rule", {}).items()}


def _fresh_out(line: str) -> str | None:
    """The `out=empty(...)` or `out=empty_like(...)` argument of `line`, or None."""
    found = re.search(r"out=empty(_like)?\(", line)
    if found is None:
        return None
    start, depth = found.start(), 0
    for i in range(found.end() - 1, len(line)):
        depth += {"(": 1, ")": -1}.get(line[i], 0)
        if depth == 0:
            return line[start:i + 1]
    return None


def drops_a_fresh_out(diff: str) -> bool:
    """Whether the mutant only drops an `out=empty(...)` (or `empty_like`) argument or makes it
    `out=None`."""
    minus = [line[1:].strip() for line in diff.splitlines()
             if line.startswith("-") and not line.startswith("---")]
    plus = added_lines(diff)
    if len(minus) != 1 or len(plus) != 1:
        return False
    arg = _fresh_out(minus[0])
    return arg is not None and plus[0] in (minus[0].replace(arg, "out=None"),
                                           minus[0].replace(arg, ""))


def function_of(mutant: str) -> str:
    """'xenith_edu.training.data.x_split_ids__mutmut_3' -> '...data.x_split_ids'."""
    return mutant.rsplit("__mutmut_", 1)[0]


def added_lines(diff: str) -> list[str]:
    return [line[1:].strip() for line in diff.splitlines()
            if line.startswith("+") and not line.startswith("+++")]


def equivalence(name: str, diff: str, entries: list[dict], rules: dict[str, str]) -> int | None:
    """The index of the entry of tests/mutants_equivalent.toml that covers mutant `name`, -1 if
    a rule does, None if nothing does."""
    plus = added_lines(diff)
    for i, e in enumerate(entries):
        if function_of(e["id"]) == function_of(name) and e["mutated"].strip() in plus:
            return i
    if "fresh_out" in rules and drops_a_fresh_out(diff):
        return -1
    return None


def report(modules: list[str], verbose: bool = True) -> bool:
    """Print the table; True if every module with results reaches TARGET with none unrun."""
    os.chdir(ROOT)
    from mutmut.mutation.data import SourceFileMutationData
    from mutmut.mutation.diff_apply import get_diff_for_mutant
    from mutmut.stats import status_by_exit_code

    entries, rules = load_equivalent(), load_rules()
    used: set[int] = set()
    rows, survivors = [], []
    known = configured_modules()
    for mod in modules:
        path = known[mod]
        data = SourceFileMutationData(path=path)
        data.load()
        counts: Counter = Counter()
        for name, code in sorted(data.exit_code_by_key.items()):
            status = status_by_exit_code[code]
            if status in UNKILLED:
                diff = get_diff_for_mutant(name, path=path)
                which = equivalence(name, diff, entries, rules)
                if which is not None:
                    used.add(which)
                    status = "equivalent"
                else:
                    survivors.append((name, status, diff))
                    status = "survived"
            counts[status] += 1
        rows.append((mod, counts))
    chosen = {known[m] for m in modules}
    stale = [e for i, e in enumerate(entries) if i not in used and path_of(e["id"]) in chosen]

    ok = True
    head = f"{'module':<20}{'mutants':>8}{'killed':>8}{'survived':>9}{'equiv.':>8}" \
           f"{'timeout':>8}{'not run':>8}{'score':>8}"
    print("\n" + head + "\n" + "-" * len(head))
    for mod, c in rows:
        killed = c["killed"] + c["caught by type check"]
        run = killed + c["survived"] + c["timeout"]
        score = 100.0 * (killed + c["timeout"]) / run if run else float("nan")
        not_run = c["not checked"] + c["check was interrupted by user"] + c["skipped"]
        total = sum(c.values())
        if total and (not_run or not score >= TARGET):
            ok = False
        print(f"{mod:<20}{total:>8}{killed:>8}{c['survived']:>9}{c['equivalent']:>8}"
              f"{c['timeout']:>8}{not_run:>8}{score:>7.1f}%")
    print(f"\nscore = (killed + timeout) / (mutants run - equivalent); target {TARGET:.0f}% "
          "in every module")
    if survivors and verbose:
        print(f"\n{len(survivors)} surviving mutants (kill each with a test, or list it in "
              f"tests/{EQUIVALENT.name} with the reason it changes nothing):")
        for name, status, diff in survivors:
            print(f"\n# {name}: {status}\n{diff}")
    for e in stale:
        print(f"\nstale entry in tests/{EQUIVALENT.name}: {e['id']} ({e['mutated']!r}) matches "
              "no surviving mutant: remove it, or update it after a change of the function")
    return ok


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("modules", nargs="*", help="module names (default: every configured one)")
    p.add_argument("--budget", type=float, default=1800, help="seconds of mutmut (default 1800)")
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                   help="parallel mutant workers (default 2)")
    p.add_argument("--report", action="store_true", help="only print the last run's report")
    p.add_argument("--quiet", action="store_true", help="the table only, no surviving diffs")
    args = p.parse_args(argv)
    known = list(configured_modules())
    unknown = sorted(set(args.modules) - set(known))
    if unknown:
        p.error(f"unknown modules {unknown}: [tool.mutmut] only_mutate lists {known}")
    if not args.report:
        start = time.monotonic()
        run_mutmut(args.modules or known, bool(args.modules), args.budget, args.jobs)
        print(f"mutants: mutmut ran {time.monotonic() - start:.0f} s")
    return 0 if report(args.modules or known, verbose=not args.quiet) else 1


if __name__ == "__main__":
    sys.exit(main())
