"""Shared fixtures of the test suite."""

from __future__ import annotations

import signal

import numpy as np
import pytest


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


@pytest.fixture(autouse=True)
def ctrl_c_raises():
    """Every test starts with Python's own Ctrl-C (KeyboardInterrupt), whatever the process
    that runs the tests set: the mutation runner, for one, ignores SIGINT, and the tests of
    interrupted writes and runs would then see nothing to wait for."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)
