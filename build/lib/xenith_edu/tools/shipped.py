"""Files shipped inside the package (xenith_edu/data/): the text, the book run, the benchmarks.
Chapters read them through `shipped`, so a notebook runs from any folder and after `pip install`.

    data/shakespeare.txt         the training text (PROVENANCE.md says where it comes from)
    data/book_run/log.jsonl      the log of `xenith-edu train --seed 1337` (README: refreshing)
    data/book_run/samples.txt    text sampled from that run's checkpoint
    data/book_run/loss.png       its loss curve
    data/memory.json             the figures of benchmarks/memory.py, which writes this copy
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

BOOK_RUN = "book_run"  # the folder of the book recipe's run, under data/


def shipped(*parts: str) -> Path:
    """The path of data/<parts...> inside the installed package; ValueError if it is absent."""
    if not parts or not all(isinstance(p, str) and p and ".." not in p for p in parts):
        raise ValueError(f"parts must be names under xenith_edu/data/, got {parts!r}")
    path = Path(str(resources.files("xenith_edu").joinpath("data", *parts)))
    if not path.exists():
        raise ValueError(f"xenith_edu/data/{'/'.join(parts)} is not shipped with this install "
                         "of the package (reinstall it: pip install xenith-edu)")
    return path


__all__ = ["BOOK_RUN", "shipped"]
