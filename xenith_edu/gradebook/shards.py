"""Past one machine: `--shard K/N` grades every N-th learner from the K-th, and `grade-merge`
joins the shards' journals into the CSV, totals and report a single run writes.

Each run, shard or not, leaves next to its CSV a facts file (`<stem>.course.json`): the
teacher's parts, its slice of the class (names, places, times, written answers). The rows
come from its journal. The merge checks that the shards are the N slices of one class, graded
for the same exercises, then ends as a single run ends (course.finish).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict
from pathlib import Path

from . import course
from .outfiles import write_text
from .points import Part

FACTS_VERSION = 2


def parse_shard(shard: object) -> tuple[int, int]:
    """(K, N) of "K/N" (1 <= K <= N); (1, 1) for None."""
    if shard is None:
        return 1, 1
    found = re.fullmatch(r"\s*(\d{1,6})\s*/\s*(\d{1,6})\s*", str(shard))
    k, n = (int(found.group(1)), int(found.group(2))) if found else (0, 0)
    if not 1 <= k <= n:
        raise ValueError(f"shard: {shard!r}: give K/N, the K-th of N slices, 1 <= K <= N "
                         "(for example 2/4)")
    return k, n


def select(count: int, k: int, n: int) -> list[int]:
    """The places in the class of the K-th slice of N: every N-th learner from the K-th."""
    return list(range(k - 1, count, n))


def class_identity(entries: list, teacher_files: list[Path], options: dict) -> str:
    """What makes a class one class: its submissions (names and files), the teacher's
    notebooks (bytes), the grading options, the package's version and the case seed."""
    from .. import __version__  # the package's, imported when a class is identified
    from .journal import fingerprint  # the one hash of a submission (journal imports roster)

    h = hashlib.sha256(json.dumps({"version": __version__, "options": options},
                                  sort_keys=True).encode())
    for learner, source, _ in entries:
        h.update(b"L" + learner.encode("utf-8", "surrogateescape") + b"\0")
        h.update((fingerprint(source) if source is not None else "-").encode() + b"\0")
    for path in teacher_files:
        h.update(b"T" + path.name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def digest(path: Path) -> str:
    """The sha256 of a file's bytes ("" when it cannot be read)."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return ""


def write_facts(path: Path, key: str, shard: tuple[int, int], size: int, parts: list[Part],
                entries: list[course.Entry], meta: dict) -> None:
    """The facts file of one run (a shard, or the whole class as shard 1 of 1): with the
    class's identity (meta["class"]) and the digest of its journal (meta["journal"])."""
    record = {"facts": FACTS_VERSION, "exercises": key, "shard": list(shard), "class": size,
              "identity": meta.get("class", ""), "journal": meta.get("journal", ""),
              "parts": [p.as_dict() for p in parts], "entries": [asdict(e) for e in entries],
              "meta": {k: meta[k] for k in ("jobs", "seconds", "sandbox") if k in meta}}
    write_text(path, json.dumps(record, indent=1) + "\n")


def _read_json(path: Path, what: str) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{path.name}: not found: grade-merge needs the {what} each shard "
                         "wrote next to its --out") from None
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path.name}: unreadable ({type(exc).__name__}): grade that shard "
                         "again") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path.name}: not a {what}: grade that shard again")
    return data


def read_facts(path: Path) -> dict:
    data = _read_json(path, "facts file")
    try:
        if data.get("facts") != FACTS_VERSION:
            raise ValueError("another version")
        data["parts"] = [Part.from_dict(p) for p in data["parts"]]
        data["entries"] = [course.Entry(**e) for e in data["entries"]]
        data["shard"] = tuple(int(x) for x in data["shard"])
        if not (isinstance(data["identity"], str) and isinstance(data["journal"], str)):
            raise ValueError("no identity")
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path.name}: not a facts file of this grader ({exc}): grade that "
                         "shard again") from None
    return data


def read_journal(path: Path, key: str, expected: str | None = None) -> dict[str, list[tuple]]:
    """The rows of each learner of a shard's journal (the last record of each wins); with
    `expected`, the journal must be the one its facts file records (its sha256)."""
    try:
        raw = path.read_bytes()
        lines = raw.decode("utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        raise ValueError(f"{path.name}: cannot be read: grade-merge needs each shard's "
                         "journal next to its --out") from None
    if expected is not None and hashlib.sha256(raw).hexdigest() != expected:
        raise ValueError(f"{path.name}: changed since its shard was graded (its digest is not "
                         "the one its facts file records): grade that shard again")
    try:
        head = json.loads(lines[0]) if lines else {}
    except ValueError:
        head = {}
    if not isinstance(head, dict) or head.get("exercises") != key:
        raise ValueError(f"{path.name}: written for other exercises than its facts file: "
                         "grade that shard again")
    rows: dict[str, list[tuple]] = {}
    for line in lines[1:]:
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line cut short when the shard was killed
        if isinstance(record, dict) and isinstance(record.get("rows"), list):
            rows[str(record.get("learner"))] = [tuple(r) for r in record["rows"]]
    return rows


def _check(shards: list[tuple[Path, dict]]) -> None:
    first = shards[0][1]
    n = first["shard"][1]
    for path, f in shards:
        same = (f["exercises"], f["class"], f["shard"][1], f["parts"], f["identity"]) == \
            (first["exercises"], first["class"], n, first["parts"], first["identity"])
        if not same:
            raise ValueError(f"{path.name}: graded another class or other exercises than "
                             f"{shards[0][0].name}: merge the shards of one run")
    ks = sorted(f["shard"][0] for _, f in shards)
    if ks != list(range(1, n + 1)):
        missing = sorted(set(range(1, n + 1)) - set(ks))
        what = "a shard is given twice" if len(set(ks)) < len(ks) else \
            f"shard {missing[0]} of {n} is missing"
        raise ValueError(f"grade-merge: {what}: give each of the {n} shards' CSV once")


def gather(shard_csvs: list[Path]) -> tuple[list[course.Entry], dict, list[Part], dict]:
    """The whole class from its shards: entries in the class's order, their rows, the
    parts and the report's figures."""
    if not shard_csvs:
        raise ValueError("grade-merge: give the --out CSV of every shard")
    shards = [(p, read_facts(course.outputs(p)["course"])) for p in shard_csvs]
    _check(shards)
    entries, base = [], {}
    for path, f in shards:
        journal = read_journal(path.with_name(path.stem + ".journal.jsonl"), f["exercises"],
                               f["journal"])
        for e in f["entries"]:
            if not e.problem and e.key not in journal:
                raise ValueError(f"{path.name}: {e.learner} was not graded (its sandbox did "
                                 f"not start): grade shard {f['shard'][0]} again with --resume")
            base[e.key] = journal.get(e.key, [])
            entries.append(e)
    entries.sort(key=lambda e: e.index)
    if [e.index for e in entries] != list(range(shards[0][1]["class"])):
        raise ValueError("grade-merge: the shards do not hold the whole class once: grade "
                         "them again with the same submissions")
    metas = [f["meta"] for _, f in shards]
    meta = {"jobs": sum(m.get("jobs", 1) for m in metas),
            "seconds": max(m.get("seconds", 0) for m in metas),
            "sandbox": metas[0].get("sandbox", ""),
            "class": shards[0][1]["identity"]}  # the written sheet's ids are drawn under it
    return entries, base, shards[0][1]["parts"], meta


def merge(shard_csvs: list[Path], out_csv: Path, **course_options) -> list[dict]:
    """Join the shards graded with `grade(..., shard="K/N")` (their --out CSV paths) into
    the CSV, totals, report and other files one run of `grade` with `course_options` writes."""
    from ..booktools.student import _as_path  # the one check of a path argument

    out_csv = _as_path(out_csv, "out_csv")
    if out_csv.is_dir() or not out_csv.parent.is_dir():
        raise ValueError(f"out_csv: {out_csv} is a folder or its folder does not exist: give a "
                         "file name such as grades.csv in an existing folder")
    entries, base, parts, meta = gather([_as_path(p, "shard_csvs") for p in shard_csvs])
    pol = course.from_options(course_options, entries, parts, course.outputs(out_csv)["written"])
    return course.finish(out_csv, entries, base, parts, pol, {**meta, "learners": len(entries)})
