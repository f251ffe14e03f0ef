"""The exercise tests record progress in a temporary file, never in the folder they run from."""

from __future__ import annotations

import pytest

from xenith_edu.exercises.progress import PROGRESS_ENV


@pytest.fixture(autouse=True)
def _progress_elsewhere(tmp_path_factory, monkeypatch):
    monkeypatch.setenv(PROGRESS_ENV, str(tmp_path_factory.mktemp("progress") / "p.json"))
