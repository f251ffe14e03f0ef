"""Running a learner's function: the one place that calls it, and the records of what it did.

A grader runs `run(fn, args)` in the learner's process; its outcome is plain data or a record.
"""

from __future__ import annotations

import numbers
import os
import traceback
import warnings
from typing import NamedTuple

import numpy as np


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



def _copy(a: object) -> object:
    return a.copy() if isinstance(a, np.ndarray) else a



def _where(exc: BaseException) -> str:
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


def to_plain(value: object) -> object:
    """The returned value as plain data: arrays, numbers, str, None, tuples and lists of them.

    Anything else becomes an `Opaque` record naming its type, so that only data leaves the
    learner's process.
    """
    if value is None or isinstance(value, bool | numbers.Number | str | np.generic):
        return value
    if type(value) is np.ndarray and value.dtype != object:
        return value
    if isinstance(value, tuple | list):
        items = [to_plain(v) for v in value]
        return tuple(items) if isinstance(value, tuple) else items
    return Opaque(type(value).__name__, repr(value)[:60])


def run(fn: object, args: tuple) -> object:
    """Calls the learner's `fn` on copies of `args`: its plain returned value, or a record.

    `Raised` if it raised, `InPlace` if it changed an argument, `NotCallable` if `fn` is no
    function. A grader runs this in the learner's process and sends the outcome back.
    """
    if not callable(fn):
        return NotCallable(type(fn).__name__, repr(fn)[:60])
    copies = tuple(_copy(a) for a in args)  # the learner works on copies of the case
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            got = fn(*copies)
    except NotImplementedError:
        return Raised("NotImplementedError", "")
    except (Exception, SystemExit) as exc:  # the learner's error is a verdict, not a crash
        return Raised(type(exc).__name__, str(exc), _where(exc))
    for i, (before, after) in enumerate(zip(args, copies, strict=True)):
        if isinstance(before, np.ndarray) and not (
            isinstance(after, np.ndarray) and after.shape == before.shape
            and np.array_equal(after, before, equal_nan=True)
        ):
            return InPlace(i)
    return to_plain(got)
