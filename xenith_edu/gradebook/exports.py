"""What leaves the grader: CSV cells no spreadsheet runs, and the gradebook files Canvas and
Moodle import, each matched by one identifier the teacher chose (the pages: feedback.py).
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import NamedTuple

from ..grader.names import escape_controls, fold
from .inputs import safe_cell
from .outfiles import write_text

CANVAS_FIXED = ("Student", "ID", "SIS User ID", "SIS Login ID", "Section")


def csv_text(fields: tuple[str, ...] | list[str], rows: list[dict]) -> str:
    """CSV whose every cell a spreadsheet reads as text, never as a formula."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(fields), lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: safe_cell(escape_controls(v, "\n\t")) for k, v in r.items()}
                     for r in rows)
    return buf.getvalue()


def _lines(header: list[str], rows: list[list[str]]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    writer.writerows([safe_cell(escape_controls(c, "\n\t")) for c in r] for r in rows)
    return buf.getvalue()


# The one identifier of each LMS's file, which the teacher chooses (`--export moodle:email`):
# LMS -> identifier -> (its column, the roster's field). The file fills that column alone.
IDENTIFIERS = {
    "canvas": {"id": ("SIS User ID", "id"), "sis_login": ("SIS Login ID", "sis_login"),
               "email": ("SIS Login ID", "email"), "canvas_id": ("ID", "canvas_id")},
    "moodle": {"email": ("Email address", "email"), "id": ("ID number", "id")},
}
DEFAULT_ID = {"canvas": "id", "moodle": "email"}  # what `--export canvas` alone means
EXPORT_CHOICES = tuple(f"{lms}{':' + key if key else ''}" for lms in IDENTIFIERS
                       for key in ("", *IDENTIFIERS[lms]))


class Export(NamedTuple):
    """One LMS file asked for: the LMS, and the identifier its rows are matched by."""

    lms: str  # "canvas" or "moodle"
    key: str  # a key of IDENTIFIERS[lms]

    @property
    def column(self) -> str:
        return IDENTIFIERS[self.lms][self.key][0]

    @property
    def field(self) -> str:
        return IDENTIFIERS[self.lms][self.key][1]

    def value(self, learner) -> str:
        """The learner's identifier: the roster's field (the id: the learner's own)."""
        if self.field == "id":
            return learner.id
        return getattr(learner.person, self.field, "") if learner.person else ""


def parse_export(text: str) -> Export:
    """`canvas`, `moodle`, or one with its identifier: `moodle:email`, `canvas:sis_login`."""
    if text in EXPORT_CHOICES:
        lms, _, key = str(text).partition(":")
        return Export(lms, key or DEFAULT_ID[lms])
    raise ValueError(f"export: {text!r} is not one of {', '.join(EXPORT_CHOICES)}")


def check_identifiers(export: Export, people: list) -> None:
    """Refuse, in one line, a file whose chosen identifier a learner lacks or two share:
    the LMS would drop that learner's grade, or give it to another."""
    where = f"export: {export.lms} by {export.field}"
    if export.field != "id" and not any(p.person for p in people):
        raise ValueError(f"{where}: give a roster (--roster) with a {export.field} column, or "
                         f"choose --export {export.lms}:id")
    lacking = [p.id for p in people if not export.value(p).strip()]
    if lacking:
        shown = ", ".join(map(escape_controls, lacking[:5])) + \
            (f" and {len(lacking) - 5} more" if len(lacking) > 5 else "")
        raise ValueError(f"{where}: {len(lacking)} learner(s) of the roster have no "
                         f"{export.field} ({shown}): fill the roster's {export.field} column, or "
                         "choose another identifier (" + ", ".join(
                             f"{export.lms}:{k}" for k in IDENTIFIERS[export.lms]) + ")")
    seen: dict[str, str] = {}
    for p in people:
        key = fold(export.value(p).strip())
        if key in seen:
            raise ValueError(f"{where}: {escape_controls(export.value(p))!r} is the "
                             f"{export.field} of both {escape_controls(seen[key])} and "
                             f"{escape_controls(p.id)}: give each learner their own")
        seen[key] = p.id


def check_exports(export: tuple[str, ...], people: list) -> tuple[str, ...]:
    """The LMS files asked for, each LMS once, each identifier checked on `people` (the
    learners the file would hold); ValueError in one line otherwise."""
    chosen: dict[str, str] = {}
    for name in export:
        found = parse_export(name)
        if chosen.get(found.lms, found.key) != found.key:
            raise ValueError(f"export: {found.lms} is asked by {chosen[found.lms]} and by "
                             f"{found.key}: choose one identifier for the whole file")
        chosen[found.lms] = found.key
        check_identifiers(found, people)
    return tuple(f"{lms}:{key}" for lms, key in chosen.items())


def canvas(people: list, lines: list[dict], parts: list, key: str = DEFAULT_ID["canvas"]
           ) -> str:
    """Canvas's gradebook import: Student, ID, SIS User ID, SIS Login ID, Section, then one
    column per assignment (a chapter here), after a "Points Possible" row. Of the three
    identifier columns, only the chosen one is filled: Canvas matches by it alone."""
    export = Export("canvas", key)
    header = [*CANVAS_FIXED, *(p.chapter for p in parts), *_notes(lines, "Notes")]
    possible = ["Points Possible", "", "", "", "",
                *(_possible(p) for p in parts), *_notes(lines, "")]
    rows = [possible]
    ids = {column: i for i, column in enumerate(CANVAS_FIXED)}
    for learner, line in zip(people, lines, strict=True):
        person = learner.person
        row = [person.name if person and person.name else learner.id, "", "", "",
               person.section if person else "", *(line[p.chapter] for p in parts),
               *_notes([line], _override_note(line))]
        row[ids[export.column]] = export.value(learner)
        rows.append(row)
    return _lines(header, rows)


def moodle(people: list, lines: list[dict], parts: list, key: str = DEFAULT_ID["moodle"]
           ) -> str:
    """Moodle's grade import: the chosen identifier's column (Email address or ID number),
    the same for every learner, then one grade column per chapter."""
    export = Export("moodle", key)
    header = [export.column, *(p.chapter for p in parts), *_notes(lines, "Feedback")]
    rows = [[export.value(p), *(line[c.chapter] for c in parts),
             *_notes([line], _override_note(line))]
            for p, line in zip(people, lines, strict=True)]
    return _lines(header, rows)


def _notes(lines: list[dict], cell: str) -> list[str]:
    """The notes column (`cell`), only in a course with overrides: an LMS file without them is
    as it was."""
    return [cell] if any("overrides" in line for line in lines) else []


def _override_note(line: dict) -> str:
    return f"override: {line['overrides']}" if line.get("overrides") else ""


def num(x: float) -> str:
    """Points as the files show them: 1, 0.5, 2.25."""
    return f"{round(x, 4):g}"


def _possible(part) -> str:
    return num(sum(part.points.values()) + sum(q.points for q in part.questions))


def exported(people: list) -> list:
    """The learners an LMS file holds: a submission the roster does not name is left out (the
    LMS would not know that learner)."""
    return [p for p in people if p.note != "not on the roster"]


def write_exports(files: dict[str, Path], export: tuple[str, ...], people: list,
                  lines: list[dict], parts: list) -> list[Path]:
    """The LMS files asked for (`canvas`, `moodle:email`...), next to the CSV; returns their
    paths. Only the learners of `exported` are in them."""
    known = [(p, line) for p, line in zip(people, lines, strict=True)
             if p in exported([p])]
    people, lines = [p for p, _ in known], [line for _, line in known]
    written = []
    for name in export:
        lms, key = parse_export(name)
        check_identifiers(Export(lms, key), people)  # checked before grading: stays true
        make = {"canvas": canvas, "moodle": moodle}[lms]
        write_text(files[lms], make(people, lines, parts, key))
        written.append(files[lms])
    return written
