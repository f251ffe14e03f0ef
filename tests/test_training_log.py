"""The book run shipped as package data is what the code produces: its first steps, rerun, agree.

The training chapter reads its loss curves, final validation loss and samples from the package's
data/book_run/ (written by `xenith-edu train --seed 1337 --out runs/book`, then copied: README).
This test reruns the first steps of that recipe with the seed the log records and compares them
with the log, so a change of the model,
the optimizer, the data pipeline or the recipe that would make the shipped figures stale fails.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from xenith_edu.tools import shipped as package_data
from xenith_edu.training import BOOK, LOG, TrainConfig, read_log, train

RUN = Path(__file__).resolve().parents[1] / "xenith_edu" / "data" / package_data.BOOK_RUN
STEPS = 20  # the first updates: a few seconds of the book config
RTOL = 1e-4  # float32 rounding differences between machines stay far below this in 20 steps
# the log keeps the loss to 6 decimals and the gradient norm to 4: one unit of the last kept
# digit may flip on another machine, which the relative tolerance alone would not allow
ATOL = {"loss": 1e-6, "grad_norm": 1e-4}


@pytest.fixture(scope="module")
def shipped() -> list[dict]:
    path = RUN / LOG
    if not path.exists():
        pytest.fail(f"{path.relative_to(RUN.parents[2])} is missing: the training chapter reads "
                    "it; make it as the README's 'The book run' says")
    return read_log(path)


def test_the_package_reads_the_one_copy() -> None:
    assert package_data.shipped(package_data.BOOK_RUN, LOG) == RUN / LOG
    for bad in [(), ("..", "x"), ("",), ("nope.json",)]:
        with pytest.raises(ValueError, match="xenith_edu/data|parts"):
            package_data.shipped(*bad)


def test_the_shipped_run_is_the_book_recipe(shipped):
    start = shipped[0]
    assert start["event"] == "start" and start["step"] == 0 and start["resumed_from"] is None
    tc = TrainConfig.from_dict(start["config"])
    assert tc == replace(BOOK, seed=tc.seed), "the shipped run was made with other settings"
    assert tc.seed == 1337, "the training chapter gives the command with --seed 1337"
    train_steps = [r["step"] for r in shipped if r["event"] == "train"]
    assert train_steps == list(range(tc.steps)), "the log does not hold every step once"
    evals = [r for r in shipped if r["event"] == "eval"]
    assert evals[-1]["step"] == tc.steps and "train_loss" in evals[-1]


def test_first_steps_rerun_match_the_shipped_log(shipped, tmp_path):
    tc = TrainConfig.from_dict(shipped[0]["config"])
    # Same seed and schedule; only the number of steps and the size of the (separately seeded)
    # evaluation change, and neither touches the training batches, the weights or the lr.
    short = replace(tc, steps=STEPS, eval_batches=1)
    train(short, tmp_path / "rerun", progress=False, verbose=False)
    rerun = [r for r in read_log(tmp_path / "rerun" / LOG) if r["event"] == "train"]
    logged = [r for r in shipped if r["event"] == "train"][:STEPS]
    assert [r["step"] for r in rerun] == [r["step"] for r in logged] == list(range(STEPS))
    for key in ("loss", "grad_norm"):
        got = np.array([r[key] for r in rerun])
        want = np.array([r[key] for r in logged])
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL[key],
                                   err_msg=f"{key} of the first {STEPS} steps differs from "
                                   "the shipped log: rerun the book recipe and the training "
                                   "chapter")
    # the learning rate is computed, not measured: it must match to the last digit logged
    assert [r["lr"] for r in rerun] == [r["lr"] for r in logged]
    # and the rerun's start record differs from the shipped one only where we changed it;
    # settings added since the shipped run take their defaults, which that run used
    config = read_log(tmp_path / "rerun" / LOG)[0]["config"]
    assert config == short.to_dict()
    was = TrainConfig.from_dict(shipped[0]["config"]).to_dict()
    assert set(shipped[0]["config"]) <= set(was) == set(config)
    assert {k for k in config if config[k] != was[k]} <= {"steps", "eval_batches"}
