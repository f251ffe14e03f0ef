"""Written answers graded by hand: the anonymous sheet the teacher fills in (opaque ids, the
key that maps them back kept in a file of its own), untouched answers flagged, the filled sheet
read back through the key.

The sheet names no learner: each learner's sheet id is a keyed hash (HMAC) of the id under the
class's identity (the digest of its submissions, teacher's notebooks and seed, which a single
run and the merge of its shards share), never a function of the id alone, which a dictionary of
the roster would reverse; the rows are in the order of those ids, not the roster's. The key
(sheet id -> learner) is written next to it, first, and read again on the next run: a learner
keeps their sheet id, and a filled sheet finds its learners.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from pathlib import Path

from ..grader.names import finder, fold
from .inputs import _points, _table, read_filled
from .outfiles import write_text

SHEET_FIELDS = ("sheet_id", "notebook", "question", "max_points", "prompt", "answer",
                "untouched", "points", "comment")
KEY_FIELDS = ("sheet_id", "learner")
# no vowels and no look-alikes (0/o, 1/l): a sheet id spells no word and no name
ALPHABET = "bcdfghjkmnpqrstvwxz23456789"
ID_LENGTH = 10
MIN_SHOWN = 3  # a roster string this long or longer never appears in a sheet id
UNTOUCHED = "yes"  # the sheet's flag: the answer is as the student version handed it out
NO_ANSWER = "no answer"  # the sheet's flag: no answer cell, or an empty one


def key_path(sheet: Path) -> Path:
    """Where the key of the sheet `sheet` is kept: grades.written.csv -> grades.written.key.csv."""
    return sheet.with_name(sheet.name.removesuffix(".csv") + ".key.csv")


def student_answer(source: str) -> str:
    """What the student version of a teacher's answer cell holds (the rule of
    `make_student_versions`: its solution blocks dropped, then `answer_stub`)."""
    from ..booktools.student import _drop_solution_blocks, answer_stub  # the one rule of the stubs

    try:
        return answer_stub(_drop_solution_blocks(source))
    except ValueError:  # a region never closed: the teacher's tools refuse it elsewhere
        return source


def _flat(text: str) -> str:
    return " ".join(text.split())


def flag(answer: str | None, stub: str) -> str:
    """The sheet's flag of one answer: NO_ANSWER (no cell, or empty), UNTOUCHED (the cell as
    handed out, white space aside), or "" (the learner wrote something)."""
    if answer is None or not answer.strip():
        return NO_ANSWER
    return UNTOUCHED if _flat(answer) == _flat(stub) else ""


def note(answer: str | None, stub: str) -> str:
    """The flag in words, for the grade's message when the teacher has not graded it."""
    return {NO_ANSWER: "no answer found in the notebook",
            UNTOUCHED: "the answer is as it was handed out: nothing was written in it",
            "": ""}[flag(answer, stub)]


def read_key(path: Path) -> dict[str, str]:
    """The key of the sheet: sheet id -> learner ({} when there is none yet)."""
    if not path.is_file():
        return {}
    out: dict[str, str] = {}
    learners: set[str] = set()
    for n, row in _table(path, "key of the written sheet", KEY_FIELDS):
        sheet_id, learner = row["sheet_id"], row["learner"]
        if not sheet_id or not learner or sheet_id in out or fold(learner) in learners:
            raise ValueError(f"{path.name}, row {n}: not the key the grader wrote (an empty, or "
                             "a repeated, sheet id or learner): restore it, or delete it and "
                             "the sheet it belongs to")
        out[sheet_id] = learner
        learners.add(fold(learner))
    return out


def _drawn(secret: str, learner: str, attempt: int) -> str:
    """A sheet id for `learner`: ID_LENGTH letters of ALPHABET from HMAC-SHA256 under `secret`."""
    digest = hmac.new(secret.encode("utf-8", "replace"),
                      f"{fold(learner)}\0{attempt}".encode("utf-8", "replace"),
                      hashlib.sha256).digest()
    number = int.from_bytes(digest, "big")
    out = []
    for _ in range(ID_LENGTH):
        number, i = divmod(number, len(ALPHABET))
        out.append(ALPHABET[i])
    return "".join(out)


def usable(sid: str, taken: set[str], avoid: set[str]) -> bool:
    """Whether a drawn sheet id may be used: not taken, holding no roster string of `avoid`,
    and not digits alone (which a spreadsheet would turn into a number)."""
    return sid not in taken and not sid.isdigit() and not any(a in sid for a in avoid)


def assign(learners: list[str], key: dict[str, str], shown: list[str],
           secret: str | None = None) -> dict[str, str]:
    """learner -> sheet id: the key's for a learner it has, else one drawn under `secret` (a
    random one when None), none of which holds a string of `shown` (the roster's ids, names,
    e-mails) MIN_SHOWN long or more."""
    secret = secret or secrets.token_hex(16)
    kept = {fold(learner): sid for sid, learner in key.items()}
    taken = set(key)
    avoid = {fold(s) for s in shown if len(s) >= MIN_SHOWN}
    out = {}
    for learner in learners:
        sid, attempt = kept.get(fold(learner)), 0
        while sid is None:
            drawn = _drawn(secret, learner, attempt)
            attempt += 1
            if usable(drawn, taken, avoid):
                sid = drawn
        taken.add(sid)
        out[learner] = sid
    return out


def _shown(people: list) -> list[str]:
    return [s for p in people for s in (p.id, *(vars(p.person).values() if p.person else ()))]


def sheet_rows(people: list, parts: list, filled: dict, ids: dict[str, str]) -> list[dict]:
    """The anonymous sheet: one row per learner who handed in and written question, in the
    order of the sheet ids, with what was filled so far."""
    from .exports import num  # points as every file shows them

    out = []
    for learner in sorted((p for p in people if p.entry is not None), key=lambda p: ids[p.id]):
        for part in parts:
            for q in part.questions:
                points, comment = filled.get((learner.id, q.id), (None, ""))
                answer = learner.entry.answers.get(part.notebook, {}).get(q.id)
                out.append(dict(zip(SHEET_FIELDS, (
                    ids[learner.id], part.notebook, q.id, num(q.points), q.prompt,
                    answer or "", flag(answer, q.stub), "" if points is None else num(points),
                    comment), strict=True)))
    return out


def write_sheet(sheet: Path, people: list, parts: list, filled: dict, key: dict[str, str],
                secret: str | None = None) -> None:
    """The key, then the anonymous sheet (a sheet never names an id its key lacks); new sheet
    ids drawn under `secret`, the class's identity."""
    from .exports import csv_text  # the one writer of the grader's CSV cells

    handed = [p.id for p in people if p.entry is not None]
    ids = assign(handed, key, _shown(people), secret)
    kept = {sid: learner for sid, learner in key.items()
            if fold(learner) not in {fold(h) for h in handed}}  # a learner of another run
    rows = [{"sheet_id": sid, "learner": learner}
            for sid, learner in sorted({**kept, **{v: k for k, v in ids.items()}}.items())]
    write_text(key_path(sheet), csv_text(KEY_FIELDS, rows))
    write_text(sheet, csv_text(SHEET_FIELDS, sheet_rows(people, parts, filled, ids)))


def read_sheet(path: Path, questions: dict[str, float], learners: set[str],
               key: dict[str, str]) -> dict[tuple[str, str], tuple[float | None, str]]:
    """The teacher's filled sheet: (learner, question) -> (points or None, comment), each
    sheet id found through `key`. A sheet with a learner column (one that names learners) is
    read as such."""
    from .inputs import csv_rows  # the header alone decides which sheet this is

    header, _ = csv_rows(path, "sheet of written answers", "save the sheet as CSV (UTF-8)")
    if "learner" in header and "sheet_id" not in header:
        return read_filled(path, questions, learners)
    known = finder(learners)
    out: dict[tuple[str, str], tuple[float | None, str]] = {}
    for n, row in _table(path, "sheet of written answers",
                         ("sheet_id", "question", "points", "comment")):
        where, question = f"{path.name}, row {n}", row["question"]
        learner = known.get(fold(key.get(row["sheet_id"].lower(), "\0")))  # as spelt
        if learner is None:
            do = "keep the sheet_id column as the grader wrote it" if key else \
                "the key (the .written.key.csv beside the grades CSV) is gone: restore it"
            raise ValueError(f"{where}: no sheet id {row['sheet_id']!r} in the key of this "
                             f"class's sheet: {do}")
        if question not in questions:
            raise ValueError(f"{where}: no written question {question!r} in the teacher's "
                             "notebooks: keep the question column as the grader wrote it")
        if (learner, question) in out:
            raise ValueError(f"{where}: {row['sheet_id']}'s {question} appears twice: keep one "
                             "row of it")
        out[(learner, question)] = (_points(row["points"], questions[question], where),
                                    row["comment"])
    return out
