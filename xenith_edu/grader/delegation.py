"""What computes an exercise's answer in the package, which a learner's function may not call:
the functions the exercise's reference calls (traced), less what the exercise lets it call.

The sandbox's worker watches the code of each of these while the learner's function runs
(sys.setprofile), so a call is seen whatever path reached it; a call makes the row "delegated".
"""

from __future__ import annotations

import copy
import functools
import re
import sys

import numpy as np

from ..chapters import chapter
from ..exercises import SPECS

# What a learner may call although the exercise's reference calls it: the package's helpers
# (workspace, the catalogue, the grader), every forward, and what the exercise itself declares
# (`Spec.may_call`, in the exercise's module: the one place it is said).
MAY_CALL_ALWAYS = ("xenith_edu.tools.", "xenith_edu.exercises.", "xenith_edu.booktools.",
                   "xenith_edu.grader.", "xenith_edu.gradebook.")


def may_call(spec, dotted: str) -> bool:
    """Whether a learner's function for `spec` may call the package function `dotted`."""
    return dotted.startswith(MAY_CALL_ALWAYS) or dotted.endswith("_forward") or \
        "<locals>" in dotted or dotted in spec.may_call


@functools.cache
def traced(exercise: str) -> tuple[str, ...]:
    """The package functions the exercise's reference calls on its first case: traced
    (sys.setprofile), never guessed from names."""
    spec = SPECS[exercise]
    case = spec.inputs(np.random.default_rng(spec.seed))[0]
    seen: dict[str, None] = {}

    def profile(frame, event, arg) -> None:
        if event == "call":
            module = frame.f_globals.get("__name__", "")
            if isinstance(module, str) and module.startswith("xenith_edu."):
                seen[f"{module}.{frame.f_code.co_qualname}"] = None

    args = copy.deepcopy(tuple(case.args))
    old = sys.getprofile()
    sys.setprofile(profile)
    try:
        spec.reference(*args)
    except Exception:  # a reference that raises on its own case computes nothing here
        pass
    finally:
        sys.setprofile(old)
    return tuple(seen)


def targets(spec) -> list[str]:
    """What computes the exercise's answer in the package: the functions its reference calls
    (traced), and the package's function named as the exercise, less what a learner may
    call. The sandbox watches each of them while the learner's function runs."""
    out = [f"spec:{spec.id}"]
    name = spec.reference_name
    if re.fullmatch(r"xenith_edu(\.\w+)+", name):
        out.append(name)  # "xenith_edu.rmsnorm.rmsnorm_backward"
    prefix = re.match(r"xenith_edu(\.\w+)*", name)
    modules = [prefix.group(0)] if prefix else []
    try:  # a function named as the exercise in the chapter's modules: xenith_edu.linear...
        modules += [f"xenith_edu.{m}" for m in chapter(spec.chapter).modules]
    except ValueError:
        pass
    for module in modules:
        mod = sys.modules.get(module)
        if mod is not None and callable(getattr(mod, spec.id, None)):
            out.append(f"{module}.{spec.id}")
    out += traced(spec.id)
    return [t for t in dict.fromkeys(out) if t.startswith("spec:") or not may_call(spec, t)]
