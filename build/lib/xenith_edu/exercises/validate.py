"""Validation of a learner's outcome: a raised error, the number, types, shapes and dtypes.

Each rule raises `Stop` with the sentence the learner reads; `engine` compares the values.
"""

from __future__ import annotations

import numbers

import numpy as np

from .outcomes import InPlace, Opaque, Raised
from .types import Spec, Status


class Stop(Exception):
    """A case ended the check: carries the status and the explanation."""

    def __init__(self, status: str, text: str) -> None:
        super().__init__(text)
        self.status, self.text = status, text


def _type_name(x: object) -> str:
    if isinstance(x, Opaque):
        return f"a {x.type_name}"
    if isinstance(x, np.ndarray):
        return f"a {x.dtype} array of shape {x.shape}"
    return f"a {type(x).__name__}"


def _raise_hint(type_name: str, text: str) -> str:
    if "could not be broadcast" in text:
        return ("Hint: the shapes don't line up. A per-row statistic that lost its axis "
                "(keepdims=True missing) or a missing transpose?")
    if "matmul" in text or "not aligned" in text:
        return "Hint: the matrix shapes don't match: a missing (or extra) transpose .T?"
    if type_name == "IndexError":
        return "Hint: an index is out of range or an array has fewer axes than you think."
    return ""


def records(spec: Spec, outcome: object, fn_name: str) -> None:
    """Raises Stop for an outcome that is a record rather than a returned value."""
    if isinstance(outcome, Raised):
        if outcome.type_name == "NotImplementedError":
            raise Stop(Status.NOT_ATTEMPTED, "")
        hint = _raise_hint(outcome.type_name, outcome.message)
        text = outcome.message.strip().rstrip(".")
        raise Stop(Status.FAILED, f"{fn_name} raised {outcome.type_name}: {text}{outcome.where}."
                            + (" " + hint if hint else ""))
    if isinstance(outcome, InPlace):
        name = spec.arg_names[outcome.position]
        raise Stop(Status.FAILED, f"{fn_name} changed its input `{name}` in place (look for "
                            f"`{name} *= ...`, `{name}[...] = ...`, `{name}.shape = ...` or "
                            f"`out={name}`). Compute new arrays: the caller still needs its "
                            "inputs.")


def unpack(spec: Spec, got: object, fn_name: str) -> tuple:
    """The learner's outputs as a tuple, one per output name; raises Stop if malformed."""
    n = len(spec.out_names)
    if spec.single:
        if got is None:
            raise Stop(Status.FAILED, f"{fn_name} returned None: a `return` missing?")
        if isinstance(got, tuple):
            raise Stop(Status.FAILED, f"{fn_name} returned a tuple of {len(got)} value(s), "
                                      f"expected a single {spec.out_names[0]}.")
        return (got,)
    if got is None:
        raise Stop(Status.FAILED, f"{fn_name} returned None: a `return` missing? Expected a tuple "
                            f"({', '.join(spec.out_names)}).")
    if not isinstance(got, tuple | list) or isinstance(got, Opaque):
        raise Stop(Status.FAILED, f"{fn_name} returned {_type_name(got)}, expected a tuple of "
                            f"{n} values ({', '.join(spec.out_names)}).")
    if len(got) != n:
        raise Stop(Status.FAILED, f"{fn_name} returned {len(got)} values, expected {n} "
                            f"({', '.join(spec.out_names)}).")
    return tuple(got)


def _shape_message(name: str, got: np.ndarray, exp: np.ndarray, hints: dict[str, str]) -> str:
    text = f"{name} has shape {got.shape}, expected {exp.shape}"
    hint = " " + hints[name] if name in hints else ""
    if got.ndim >= 2 and got.shape == exp.shape[::-1]:
        return text + ": transposed?"
    if got.ndim < exp.ndim:
        return text + ": an axis was reduced away (keepdims=True missing, or a sum over too " \
                      "many axes?)." + hint
    if got.ndim > exp.ndim:
        return text + ": an extra axis (a sum over the positions missing?)." + hint
    if sorted(got.shape) == sorted(exp.shape):
        return text + ": the axes are in the wrong order?" + hint
    return text + "." + hint if hint else text + ": a sum or mean over the wrong axis?"


def _dtype_message(name: str, got: np.dtype, exp: np.dtype, extra: str) -> str:
    text = f"{name} has dtype {got}, expected {exp} (keep the dtype of the inputs)"
    if exp == np.float32 and got == np.float64:
        text += (": a float64 array slipped in. np.zeros(shape) and np.ones default to float64;"
                 " use np.zeros_like(...) or dtype=x.dtype")
    elif exp == np.float64 and got == np.float32:
        text += ": float64 was asked for; don't cast to float32 or create float32 arrays"
    elif got.kind in "iub":
        text += ": integer arithmetic? Start from a float array of the inputs' dtype"
    return text + "." + (" " + extra if extra else "")


def _validate_array(spec: Spec, name: str, g: object, e: np.ndarray, outs: tuple,
                    expected: tuple) -> None:
    if not isinstance(g, np.ndarray) or isinstance(g, np.matrix):
        raise Stop(Status.FAILED, f"{name} should be a NumPy array of shape {e.shape}, "
                           f"got {_type_name(g)}.")
    if g.shape != e.shape:
        text = _shape_message(name, g, e, spec.shape_hints)
        # swapped outputs: each has the shape the other one should have
        swapped = [n for n, o, x in zip(spec.out_names, outs, expected, strict=True)
                   if n != name and isinstance(x, np.ndarray) and x.shape == g.shape
                   and getattr(o, "shape", None) == e.shape]
        if swapped:
            text = (f"{name} has shape {g.shape}, expected {e.shape}; that is the shape "
                    f"of {swapped[0]}: are the outputs in the order "
                    f"({', '.join(spec.out_names)})?")
        raise Stop(Status.FAILED, text)
    if g.dtype != e.dtype and not (e.dtype.kind in "iu" and g.dtype.kind in "iu"):
        raise Stop(Status.FAILED, _dtype_message(name, g.dtype, e.dtype, spec.dtype_hint))


def validate(spec: Spec, outs: tuple, expected: tuple) -> None:
    """Type, shape and dtype of every output, strictly; raises Stop."""
    for name, kind, g, e in zip(spec.out_names, spec.kinds, outs, expected, strict=True):
        if g is None:
            raise Stop(Status.FAILED, f"{name} is None: a `return` missing?")
        if kind == "array":
            _validate_array(spec, name, g, e, outs, expected)
        elif kind == "float":
            if isinstance(g, np.ndarray) and g.shape == () and g.dtype.kind in "iuf":
                g = g[()]
            if isinstance(g, bool | np.bool_) or not isinstance(g, numbers.Real):
                raise Stop(Status.FAILED,
                           f"{name} should be a number (a float), got {_type_name(g)}.")
        elif kind == "int":
            if isinstance(g, np.ndarray) and g.shape == () and g.dtype.kind in "iu":
                g = g[()]
            if isinstance(g, bool | np.bool_) or not isinstance(g, int | np.integer):
                extra = ""
                if isinstance(g, float | np.floating):
                    extra = " Use integer arithmetic (// rather than /) or int(...)."
                raise Stop(Status.FAILED, f"{name} should be an int, got {_type_name(g)} "
                                    f"({g!r}).{extra}")
