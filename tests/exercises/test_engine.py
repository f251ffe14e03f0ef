"""The engine every check shares: generic mistakes, the registry, the grader's interface.

`judge` is a pure function of inputs and outcomes, the cases vary with the rng, and the mistakes
any exercise can make (raising, NaN, a flipped sign, an extra axis...) are caught everywhere.
"""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path

import numpy as np
import pytest

import xenith_edu.exercises as ex
from xenith_edu import chapters
from xenith_edu.exercises import engine

from . import (
    test_attention,
    test_backward,
    test_rmsnorm,
    test_rope,
    test_softmax_ce,
    test_training,
)
from .helpers import kw, raising, run

HERE = Path(__file__).parent
# every chapter's catalogue, found from the registry: tests/exercises/test_<slug>.py
MODULES = tuple(importlib.import_module(f"{__package__}.test_{c.slug}") for c in chapters.CHAPTERS
                if (HERE / f"test_{c.slug}.py").is_file())
RIGHT = {name: pair for m in MODULES for name, pair in m.RIGHT.items()}


def test_the_table_of_exercises_is_complete():
    assert set(RIGHT) <= set(ex.SPECS) == set(ex.CHECKS)
    order = [c.slug for c in chapters.CHAPTERS]
    assert [order.index(s.chapter) for s in ex.SPECS.values()] == sorted(
        order.index(s.chapter) for s in ex.SPECS.values())
    for name, (slug, check) in ex.CHECKS.items():
        assert check is getattr(ex, f"check_{name}")
        assert slug == ex.SPECS[name].chapter
        assert check.__module__ == f"xenith_edu.exercises.{slug}"
        assert ex.SPECS[name].id == name


# Mistakes any exercise can make, applied to each right answer in turn.
def _outputs(fn, transform):
    def learner(*args):
        out = fn(*args)
        if isinstance(out, tuple):
            return tuple(transform(o) for o in out)
        return transform(out)
    return learner


def _has_array_output(name: str) -> bool:
    """Whether the exercise returns a float array (integer answers cannot be NaN or float32)."""
    spec = ex.SPECS[name]
    out = spec.reference(*spec.make_cases()[0].args)
    return any(isinstance(o, np.ndarray) and o.dtype.kind == "f" for o in out)


GENERIC = {
    "raises": (lambda f: raising(ZeroDivisionError("division by zero")),
               ["raised ZeroDivisionError: division by zero", "line "]),
    "exits": (lambda f: raising(SystemExit(1)), ["raised SystemExit"]),
    "returns None": (lambda f: (lambda *a: None), ["returned None", "`return` missing"]),
    "not callable": (lambda f: 42, ["expected a function, got 42 (int)"]),
}
GENERIC_ARRAYS = {
    "NaN": (lambda f: _outputs(f, lambda o: np.full_like(o, np.nan)
                               if isinstance(o, np.ndarray) else o), ["contains NaN"]),
    "sign flipped": (lambda f: _outputs(f, lambda o: -o), ["sign"]),
    "extra axis": (lambda f: _outputs(f, lambda o: o[None] if isinstance(o, np.ndarray) else o),
                   ["has shape (1, ", "an extra axis"]),
    "float32 instead of float64": (lambda f: _outputs(
        f, lambda o: o.astype(np.float32) if isinstance(o, np.ndarray) else o),
        ["dtype float32, expected float64"]),
}


@pytest.mark.parametrize("name", sorted(RIGHT))
@pytest.mark.parametrize("mistake", sorted(GENERIC) + sorted(GENERIC_ARRAYS))
def test_common_mistakes_of_every_exercise(name, mistake):
    if mistake in GENERIC_ARRAYS and not _has_array_output(name):
        pytest.skip("the answer is a number")
    make, words = {**GENERIC, **GENERIC_ARRAYS}[mistake]
    result = run(name, make(RIGHT[name][0]))
    assert result.status == "failed", result.message
    for word in words:
        assert word in result.message, f"{word!r} not in:\n{result.message}"


@pytest.mark.parametrize("name", sorted(RIGHT))
def test_not_attempted_yet(name):
    result = run(name, raising(NotImplementedError()))
    assert result.status == "not attempted" and not result.passed
    assert "[not attempted yet]" in result.message
    assert "the notebook goes on with" in result.message


@pytest.mark.parametrize("name", [n for n in sorted(RIGHT) if _has_array_output(n)])
def test_changing_any_input_in_place_is_caught(name):
    right = RIGHT[name][0]

    def learner(*args):
        out = right(*args)
        for a in args:  # the first float array argument gets scribbled on afterwards
            if isinstance(a, np.ndarray) and a.dtype.kind == "f":
                a *= 2
                break
        return out

    result = run(name, learner)
    assert result.status == "failed"
    assert "in place" in result.message


def test_a_scalar_that_broadcasts_is_not_accepted():
    # dw of shape () or (1,) would broadcast against (d,) in a loose comparison
    rms = test_rmsnorm.rms
    result = ex.check_rmsnorm_backward(lambda dy, x, w, eps: (rms(dy, x, w, eps)[0],
                                                              np.float64(0.0)))
    assert re.search(r"dw should be a NumPy array of shape \(\d+,\)", result.message)


def test_verdict_names_the_case_and_is_deterministic():
    a = ex.check_rmsnorm_backward(kw(test_rmsnorm.rms, mean_term="missing"))
    b = ex.check_rmsnorm_backward(kw(test_rmsnorm.rms, mean_term="missing"))
    assert a == b
    cases = ex.SPECS["rmsnorm_backward"].make_cases()
    assert f"case 1 of {len(cases)} ({cases[0].label})" in a.message
    assert "worst at index (" in a.message and "relative error" in a.message


def test_float32_only_mistake_is_found_on_its_case():
    rms = test_rmsnorm.rms

    def learner(dy, x, w, eps):
        dx, dw = rms(dy, x, w, eps)
        return (dx, dw) if x.dtype == np.float64 else (dx * 1.01, dw)

    result = ex.check_rmsnorm_backward(learner)
    assert "case 2 of 8 (float32, " in result.message
    assert "dx is wrong" in result.message


def test_checks_leave_numpy_state_alone():
    before = np.geterr()
    ex.check_softmax_cross_entropy(kw(test_softmax_ce.ce, shift=False))
    assert np.geterr() == before


def test_grade_log_gets_one_json_line_per_check(tmp_path, monkeypatch):
    log = tmp_path / "grades.jsonl"
    monkeypatch.setenv(ex.GRADE_LOG_ENV, str(log))
    ex.check_linear_backward(test_backward.linear)
    ex.check_label_smoothing(raising(NotImplementedError()))
    ex.check_rope_backward(kw(test_rope.rope_bwd, way=1.0))
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(e["exercise"], e["status"]) for e in lines] == [
        ("linear_backward", "passed"), ("label_smoothing", "not attempted"),
        ("rope_backward", "failed")]
    assert "RoPE rotated the wrong way" in lines[2]["message"]


def test_no_grade_log_without_the_variable(tmp_path, monkeypatch):
    monkeypatch.delenv(ex.GRADE_LOG_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    ex.check_linear_backward(test_backward.linear)
    assert list(tmp_path.iterdir()) == []


def test_the_teachers_page_shows_a_real_verdict():
    page = Path(__file__).resolve().parents[2] / "book" / "teaching.md"
    if not page.exists():
        pytest.skip("no teachers' page")
    text = page.read_text()
    code = re.search(r"```python\n(def my_rmsnorm_backward.*?)```", text, re.S).group(1)
    shown = re.search(r"```text\n(\[failed\] rmsnorm_backward.*?)\n```", text, re.S).group(1)
    namespace = {"np": np}
    exec(code, namespace)
    result = ex.check_rmsnorm_backward(namespace["my_rmsnorm_backward"])
    assert result.message == shown


# ---------------------------------------------------------------- the grader's interface
def _signature(case: ex.Case) -> tuple:
    """Shapes and plain numbers of a case: what must vary with the rng."""
    return tuple(a.shape if isinstance(a, np.ndarray) else a for a in case.args)


@pytest.mark.parametrize("name", sorted(RIGHT))
def test_a_random_rng_varies_the_cases(name):
    spec = ex.SPECS[name]
    assert [c.label for c in spec.make_cases()] == [c.label for c in spec.make_cases()]
    drawn = [spec.make_cases(np.random.default_rng(s)) for s in range(6)]
    assert all(len(d) >= 1 for d in drawn)
    values = [np.concatenate([np.ravel(a) for c in d for a in c.args
                              if isinstance(a, np.ndarray)] or [np.zeros(1)]) for d in drawn]
    assert len({v.tobytes() for v in values}) == 6 or len(
        {tuple(_signature(c) for c in d) for d in drawn}) >= 3


@pytest.mark.parametrize("name", sorted(RIGHT))
def test_every_plain_setting_varies_across_cases_and_draws(name):
    # no size or hyperparameter held fixed for every case of every draw
    spec = ex.SPECS[name]
    cases = [c for s in range(4) for c in spec.make_cases(np.random.default_rng(s))]
    for position, arg_name in enumerate(spec.arg_names):
        seen = set()
        for c in cases:
            a = c.args[position]
            seen.add(a.shape if isinstance(a, np.ndarray) else a)
        assert len(seen) > 1, f"{name}: {arg_name} is the same in every case: {seen}"


def test_judge_is_pure_and_never_calls_the_learner():
    spec = ex.SPECS["rmsnorm_backward"]
    inputs = spec.inputs(np.random.default_rng(5))
    calls = [(c, ex.run(test_rmsnorm.rms, c.args)) for c in inputs]
    first = ex.judge(spec, calls)
    assert first.passed and ex.judge(spec, calls) == first
    wrong = kw(test_rmsnorm.rms, mean_term="missing")
    calls = [(c, ex.run(wrong, c.args)) for c in inputs]
    result = ex.judge(spec, calls, fn_name="my_rms")
    assert not result.passed and "mean term of RMSNorm's Jacobian is missing" in result.message


def test_records_stand_for_what_the_learner_did():
    spec = ex.SPECS["linear_backward"]
    case = spec.make_cases()[0]
    raised = ex.Raised("ValueError", "shapes (5,4) and (3,) not aligned", " (line 2: `x @ w`)")
    verdicts = {
        raised: "my_f raised ValueError: shapes (5,4) and (3,) not aligned (line 2: `x @ w`).",
        ex.InPlace(1): "my_f changed its input `X` in place",
        ex.NotCallable("int", "42"): "expected a function, got 42 (int)",
        ex.Opaque("Thing", "<Thing>"): "returned a Thing, expected a tuple of 2 values",
        ex.Raised("NotImplementedError", ""): "[not attempted yet]",
    }
    for outcome, words in verdicts.items():
        message = ex.judge(spec, [(case, outcome)], fn_name="my_f").message
        assert words in message, message


def test_no_outcome_is_no_pass():
    spec = ex.SPECS["linear_backward"]
    assert ex.judge(spec, []).status == "failed"
    probe_only = ex.SPECS["attention_backward"].inputs()[-1:]
    assert not ex.judge(ex.SPECS["attention_backward"], [(c, None) for c in probe_only]).passed


def test_run_returns_plain_data_or_records():
    class Thing:
        pass

    assert isinstance(ex.run(lambda: Thing(), ()), ex.Opaque)
    assert ex.run(lambda: (np.ones(2), [1, 2.0], None), ())[1] == [1, 2.0]
    assert isinstance(ex.run(42, ()), ex.NotCallable)
    assert ex.run(lambda: 1 / 0, ()).type_name == "ZeroDivisionError"
    a = np.ones(3)
    assert ex.run(lambda x: x.__imul__(2), (a,)) == ex.InPlace(0) and np.all(a == 1)


def test_the_probe_is_an_input_and_its_outcome_diagnoses():
    spec = ex.SPECS["attention_backward"]
    inputs = spec.inputs()
    assert [c.probe for c in inputs].count(True) == 1 and inputs[-1].probe
    mutant = kw(test_attention.attn, mask_future=False)
    assert "leaks through the causal mask" in run("attention_backward", mutant).message
    calls = [(c, ex.run(mutant, c.args)) for c in inputs[:-1]]  # without the probe
    assert "leaks" not in ex.judge(spec, calls).message


def test_a_chapter_module_is_found_from_the_registry():
    for spec in ex.SPECS.values():
        assert spec.chapter in {c.slug for c in chapters.CHAPTERS}
    assert engine.CANNOT


# ---------------------------------------------------------------- what a verdict must say
def test_enough_digits_to_show_the_difference():
    rms = test_rmsnorm.rms
    result = ex.check_rmsnorm_backward(lambda *a: (rms(*a)[0] * (1 + 3e-7), rms(*a)[1]))
    shown = re.search(r"expected (\S+), got (\S+) \(relative error", result.message)
    assert shown and shown.group(1) != shown.group(2), result.message
    assert engine.fmt_pair(1.0, 1.0 + 1e-12) == ("1", "1.000000000001")


def test_nan_gets_a_hint():
    linear = test_backward.linear
    result = ex.check_linear_backward(lambda dY, X, W: (linear(dY, X, W)[0] * np.nan,
                                                        linear(dY, X, W)[1]))
    assert "dX contains NaN" in result.message and engine.NAN_HINT in result.message
    assert engine.CANNOT not in result.message


def test_a_scalar_is_never_off_by_an_unnamed_constant_factor():
    lr_sched = test_training.lr_sched
    result = ex.check_lr_schedule(lambda *a: 1.37 * lr_sched(*a))
    assert "constant factor" not in result.message
    assert engine.CANNOT in result.message  # says plainly that it cannot name the mistake


def test_an_unknown_mistake_is_said_to_be_unknown():
    rms = test_rmsnorm.rms
    result = ex.check_rmsnorm_backward(lambda *a: (rms(*a)[0] + 0.1 * a[1] ** 3, rms(*a)[1]))
    assert "dx is wrong" in result.message and engine.CANNOT in result.message
    assert "Likely mistake" not in result.message


@pytest.mark.parametrize("name", sorted(RIGHT))
def test_each_check_names_its_chapter_by_its_registered_title(name):
    slug, check = ex.CHECKS[name]
    doc = " ".join(check.__doc__.split())
    assert f'the "{chapters.chapter(slug).title}" chapter' in doc.replace("See the", "the")


@pytest.mark.parametrize("name", sorted(RIGHT))
def test_every_float_output_has_a_floor_tied_to_the_inputs(name):
    spec = ex.SPECS[name]
    if not any(
            isinstance(o, float | np.ndarray) and np.asarray(o).dtype.kind == "f"
            for o in spec.reference(*spec.make_cases()[0].args)):
        pytest.skip("integer answers are compared exactly")
    for case in spec.make_cases():
        floors = spec.floor(tuple(np.asarray(a, dtype=np.float64) if isinstance(a, np.ndarray)
                                  else a for a in case.args))
        assert set(floors) == set(spec.out_names)
        assert all(np.isfinite(v) and v > 0 for v in floors.values()), (case.label, floors)


def test_a_coincidence_of_sizes_is_not_a_diagnosis():
    # B == itemsize: ignoring the itemsize gives exactly the bytes without the batch; the
    # other cases tell the two apart, so only the true mistake is named
    spec = ex.SPECS["attention_cache_bytes"]
    cases = [ex.Case("B=4, H=6, S=256, hd=32, itemsize=4", (4, 6, 256, 32, 4))]
    cases += spec.make_cases()
    no_itemsize = lambda B, H, S, hd, i: B * H * (3 * S * hd + S * (S + 1) // 2)  # noqa: E731
    message = ex.judge(spec, [(c, ex.run(no_itemsize, c.args)) for c in cases]).message
    assert f"case 1 of {len(cases)}" in message and "counts numbers, not bytes" in message
    assert "batch is missing" not in message
    alone = ex.judge(spec, [(cases[0], ex.run(no_itemsize, cases[0].args))]).message
    assert "batch is missing" in alone  # one case alone cannot tell them apart
