"""What the grader writes: atomically, with the mode book/teaching.md states, readable by the
teacher's group and by no one else (0640 files, 0750 folders), whatever the umask.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..tools.util import atomic_write

FILE_MODE = 0o640  # the owner writes, the group reads, others nothing
FOLDER_MODE = 0o750


def write_text(path: Path, text: str) -> None:
    """`text` (UTF-8) to `path`, atomically; the file has FILE_MODE before it has a name."""
    data = text.encode("utf-8")

    def write(f) -> None:
        os.fchmod(f.fileno(), FILE_MODE)
        f.write(data)

    atomic_write(path, write)


def make_folder(path: Path) -> None:
    """A folder of the grader's output (the feedback pages): FOLDER_MODE when it makes it."""
    if not path.is_dir():
        path.mkdir(mode=FOLDER_MODE, parents=True, exist_ok=True)
        os.chmod(path, FOLDER_MODE)
