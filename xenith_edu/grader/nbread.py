"""A learner's notebook read for the grader in a child process under the sandbox's memory and
time limits: the written answers found, and the cells tagged skip-grading emptied in the copy.

Nothing a learner hands in is parsed in the grader's own process: a notebook of tens of
millions of tiny JSON objects costs this child its memory limit, and the grader one row of
that learner ("over the limit"). Standard library only: the child starts as `python -I -S`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

WRITTEN_TAG = "written-answer"  # a markdown cell that holds a written answer
SKIP_TAG = "skip-grading"  # a code cell grading does not run (a long training run, a figure)
MAX_NOTEBOOK = 64 << 20  # bytes of a learner's notebook read at all
MAX_ANSWER = 20_000  # characters of one written answer kept
CHILD_CPU = 30  # seconds of CPU time of the child that reads one learner's notebooks


class OverLimit(Exception):
    """The learner's notebooks could not be read within the limits: that learner's row."""


def _tags(cell: dict) -> list:
    meta = cell.get("metadata")
    tags = meta.get("tags") if isinstance(meta, dict) else None
    return tags if isinstance(tags, list) else []


def _nbgrader(cell: dict) -> dict:
    meta = cell.get("metadata")
    found = meta.get("nbgrader") if isinstance(meta, dict) else None
    return found if isinstance(found, dict) else {}


def is_written(cell: dict) -> bool:
    """A markdown cell that holds a written answer: tagged WRITTEN_TAG, or nbgrader's
    manually graded answer (solution and grade)."""
    meta = _nbgrader(cell)
    return cell.get("cell_type") == "markdown" and (
        WRITTEN_TAG in _tags(cell) or (meta.get("solution") is True and meta.get("grade") is True))


def cell_key(cell: dict) -> str | None:
    """How a cell is found again in a learner's copy: nbgrader's grade_id, else the cell's id."""
    for key in (_nbgrader(cell).get("grade_id"), cell.get("id")):
        if isinstance(key, str) and key:
            return key
    return None


def _source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)


def _load(path: Path) -> dict | None:
    try:
        st = os.lstat(path)
        if not (path.is_file() and not path.is_symlink()) or st.st_size > MAX_NOTEBOOK:
            return None
        nb = json.loads(path.read_bytes().decode("utf-8", "replace"))
    except (OSError, ValueError, RecursionError):
        return None
    cells = nb.get("cells") if isinstance(nb, dict) else None
    return nb if isinstance(cells, list) else None


def blank_skipped(path: Path) -> int:
    """Empty, in the grader's private copy `path`, the code cells tagged `skip-grading`;
    returns how many. A notebook that cannot be read is left for the sandbox to report."""
    nb = _load(path)
    if nb is None:
        return 0
    count = 0
    for cell in nb["cells"]:
        if isinstance(cell, dict) and cell.get("cell_type") == "code" and \
                SKIP_TAG in _tags(cell):
            cell["source"] = ""
            count += 1
    if count:
        with open(path, "w", encoding="utf-8") as f:  # in place: the copy keeps its owner
            json.dump(nb, f)
    return count


def answers(path: Path, wanted: set[str]) -> dict[str, str]:
    """The learner's answer to each written question (by key) found in their notebook."""
    nb = _load(path) if wanted else None
    if nb is None:
        return {}
    out: dict[str, str] = {}
    for n, cell in enumerate(nb["cells"], start=1):
        if not isinstance(cell, dict) or cell.get("cell_type") != "markdown":
            continue
        key = cell_key(cell) or f"cell-{n}"
        if key in wanted and key not in out:
            out[key] = _source(cell).strip()[:MAX_ANSWER]
    return out


def prepare(items: list[dict]) -> dict[str, dict[str, str]]:
    """For each {"name", "path", "questions"}: its answers found, its skipped cells emptied."""
    found = {}
    for item in items:
        path = Path(item["path"])
        if item["questions"]:
            found[item["name"]] = answers(path, set(item["questions"]))
        blank_skipped(path)
    return found


def read_limited(items: list[dict], memory: int, seconds: float) -> dict[str, dict[str, str]]:
    """`prepare(items)` in a child process of at most `memory` bytes and `seconds` of time;
    raises OverLimit when the child does not finish within them."""
    request = json.dumps({"items": items, "memory": int(memory)})
    try:
        done = subprocess.run([sys.executable, "-I", "-S", os.path.abspath(__file__)],
                              input=request.encode(), capture_output=True, timeout=seconds,
                              check=False)
    except subprocess.TimeoutExpired:
        raise OverLimit(f"its notebooks took more than {seconds:g} s to read") from None
    if done.returncode != 0:
        why = "memory" if b"MemoryError" in done.stderr else f"exit status {done.returncode}"
        raise OverLimit(f"its notebooks could not be read within the grader's limits ({why})")
    try:
        found = json.loads(done.stdout)
    except ValueError:
        raise OverLimit("its notebooks could not be read within the grader's limits") from None
    return found if isinstance(found, dict) else {}


def _child() -> None:
    import resource  # POSIX only: the child runs where the grader does (Linux), not at import

    request = json.loads(sys.stdin.buffer.read())
    memory = int(request["memory"])
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CPU, (CHILD_CPU, CHILD_CPU))
    found = prepare(request["items"])
    sys.stdout.write(json.dumps(found))


if __name__ == "__main__":
    _child()
