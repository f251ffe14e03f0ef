"""Shared fixtures of the test suite, and its areas: `pytest --fast tests` (`make test-fast`)
collects only the areas a change to one component needs (FAST); every test file of an area
also carries its area's marker (`pytest -m model tests`)."""

from __future__ import annotations

import signal
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent

# make test-fast: area -> its test files (a folder: every file in it), under tests/
FAST: dict[str, tuple[str, ...]] = {
    "components": ("test_components.py", "test_caches.py", "test_flash_attention.py",
                   "test_gqa.py", "test_gradcheck.py", "test_workspace.py", "test_optim.py"),
    "model": ("test_model.py", "test_boundaries.py", "test_sample.py"),
    "checks": ("exercises/",),
    "layers": ("test_layers.py", "test_chapters.py", "test_contributing.py", "test_notation.py"),
}


def area_of(path: Path) -> str | None:
    """The FAST area a test file belongs to, or None."""
    try:
        rel = path.resolve().relative_to(HERE).as_posix()
    except ValueError:
        return None
    for area, names in FAST.items():
        if any(rel == n or (n.endswith("/") and rel.startswith(n)) for n in names):
            return area
    return None


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--fast", action="store_true",
                     help="only the fast areas (components, model, checks, layers): "
                          "make test-fast")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Under --fast, a test file of no fast area is not even imported."""
    if not config.getoption("--fast") or collection_path.is_dir():
        return None
    if collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
        return True if area_of(collection_path) is None else None
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        area = area_of(Path(str(item.path)))
        if area is not None:
            item.add_marker(getattr(pytest.mark, area))


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
