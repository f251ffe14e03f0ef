"""Running a learner's function: the one place that calls it, and the records of what it did.
The notebook's checks and the grader's sandbox worker both call `run`: one rule, one verdict.

It imports only NumPy and the standard library, so that the sandbox can load it alone, without
the exercise catalogue.
"""

from __future__ import annotations

import numbers
import os
import traceback
import warnings
from enum import Enum
from typing import NamedTuple

import numpy as np


class Status(str, Enum):
    """What a check concluded (the first three), and what grading a class concludes of a row
    (the others): one enum for the exercises and the grader. A `str`, so that CSV and JSON
    write its value ("passed")."""

    PASSED = "passed"
    FAILED = "failed"
    NOT_ATTEMPTED = "not attempted"
    DELEGATED = "delegated"  # the learner's function handed the work to the package's own
    MISSING = "missing"  # the function, or the notebook, is not in the submission
    NOTEBOOK_ERROR = "notebook error"  # the notebook did not run to its end
    PROTOCOL_ERROR = "protocol error"  # the sandbox's reply broke the protocol: tampering
    UNREADABLE = "unreadable file"  # a file the walk refuses (a link, a pipe, a bad name)
    OVER_LIMIT = "over the limit"  # a submission too deep, too large, or its notebooks too big
    COLLISION = "name collision"  # several submissions would be one learner
    NOT_SUBMITTED = "not submitted"  # a learner of the roster who handed nothing in
    TO_GRADE = "to grade"  # a written answer the teacher has not graded yet
    GRADED = "graded"  # a written answer the teacher graded

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


# The outcome of one call, other than a returned value. All are plain records of strings, so a
# grader can carry them from the learner's process to its own.
class Raised(NamedTuple):
    """The learner's function raised: the exception's type name, message and source line."""

    type_name: str
    message: str
    where: str = ""  # " (line 3: `x / rms`)" in the learner's own code, or ""


class InPlace(NamedTuple):
    """The learner's function changed its argument number `position` (0-based) in place."""

    position: int


class NotCallable(NamedTuple):
    """What the learner passed is not a function: its type name and a short repr."""

    type_name: str
    text: str


class Opaque(NamedTuple):
    """A returned object that is not plain data (array, number, tuple, list, None, str)."""

    type_name: str
    text: str



MAX_DEPTH = 64  # nesting of a returned value's tuples and lists that is read as data


def _copy(a: object) -> object:
    return a.copy() if isinstance(a, np.ndarray) else a


def changed(before: object, after: object) -> bool:
    """The in-place rule: an array argument whose shape, dtype or values the call changed."""
    if not isinstance(before, np.ndarray):
        return False
    return not (isinstance(after, np.ndarray) and after.shape == before.shape
                and after.dtype == before.dtype and np.array_equal(after, before, equal_nan=True))


def where(exc: BaseException) -> str:
    """' (line 3: `x / rms`)' for the last frame of the learner's own code, or ''."""
    frames = traceback.extract_tb(exc.__traceback__)
    numpy_dir = os.path.dirname(np.__file__)
    here = os.path.dirname(os.path.abspath(__file__))
    mine = [f for f in frames if not f.filename.startswith(numpy_dir)
            and os.path.dirname(os.path.abspath(f.filename)) != here]
    if not mine or mine[-1].lineno is None:
        return ""
    f = mine[-1]
    return f" (line {f.lineno}: `{f.line.strip()}`)" if f.line else f" (line {f.lineno})"


def raised(exc: BaseException) -> Raised:
    """The record of an exception the learner's function raised."""
    if isinstance(exc, NotImplementedError):
        return Raised("NotImplementedError", "")
    return Raised(type(exc).__name__, _text(exc)[:2000], where(exc))


def _text(value: object) -> str:
    try:
        return str(value)
    except Exception:  # a learner's __str__ may raise
        return "?"


def _repr(value: object) -> str:
    try:
        return repr(value)[:60]
    except Exception:  # a learner's __repr__ may raise
        return "?"


def to_plain(value: object, depth: int = 0) -> object:
    """The returned value as plain data: arrays, numbers, str, None, tuples and lists of them.

    Anything else, and a tuple or list nested deeper than MAX_DEPTH, becomes an `Opaque`
    record naming its type, so that only data leaves the learner's process.
    """
    if value is None or isinstance(value, bool | numbers.Number | str | np.generic):
        return value
    if type(value) is np.ndarray and value.dtype != object:
        return value
    if isinstance(value, tuple | list):
        if depth >= MAX_DEPTH:
            return Opaque(type(value).__name__, "nested too deeply to be read")
        items = [to_plain(v, depth + 1) for v in value]
        return tuple(items) if isinstance(value, tuple) else items
    return Opaque(type(value).__name__, _repr(value))


def run(fn: object, args: tuple) -> object:
    """Calls the learner's `fn` on copies of `args`: its plain returned value, or a record.

    `Raised` if it raised, `InPlace` if it changed an argument (its shape, dtype or values),
    `NotCallable` if `fn` is no function. The notebook's check and the grader's sandbox both
    call this; the sandbox sends the outcome back as data.
    """
    if not callable(fn):
        return NotCallable(type(fn).__name__, _repr(fn))
    copies = tuple(_copy(a) for a in args)  # the learner works on copies of the case
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            got = fn(*copies)
    except (Exception, SystemExit) as exc:  # the learner's error is a verdict, not a crash
        return raised(exc)
    for i, (before, after) in enumerate(zip(args, copies, strict=True)):
        if changed(before, after):
            return InPlace(i)
    return to_plain(got)
