"""Learners' names as data: one canonical id (Unicode NFC), its case-folded key where a disk
ignores case, and the same text with every control character escaped for files and terminals.

The roster match, the journal, every file name and every export use `canonical`; two learners
whose keys (`fold`) or file names are the same are reported and kept apart, never merged.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata

# what a terminal or a viewer may obey instead of showing: C0, DEL, C1, and format characters
# (bidirectional overrides, zero-width joiners): escaped wherever a name is shown
_CONTROL = ("Cc", "Cf", "Zl", "Zp")


def canonical(name: str) -> str:
    """The one form of a learner's id: Unicode NFC (a zip made on macOS stores NFD names),
    its control characters escaped (a name never steers a terminal or a file)."""
    return escape_controls(unicodedata.normalize("NFC", name))


def fold(name: str) -> str:
    """The key two ids are compared by where a disk ignores case (macOS, Windows)."""
    return unicodedata.normalize("NFC", canonical(name).casefold())


def finder(ids) -> dict[str, str]:
    """fold(id) -> id: how an id a teacher's file gives (the roster, the timestamps, the
    sheet) finds its learner, with or without case, as the disk that held the submission."""
    return {fold(i): i for i in ids}


def escape_controls(text: object, keep: str = "") -> str:
    """`text` with every control or format character (but those in `keep`, such as a
    message's line breaks) written as a \\x, \\u escape."""
    out = []
    for ch in str(text):
        if ch not in keep and unicodedata.category(ch) in _CONTROL:
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if
                       code < 0x10000 else f"\\U{code:08x}")
        else:
            out.append(ch)
    return "".join(out)


_RESERVED = re.compile(r"(con|prn|aux|nul|com\d|lpt\d|conin\$|conout\$)(\..*)?")
_PURE = re.compile(r"[a-z0-9_-][a-z0-9._-]{0,79}")


def file_stem(learner: str) -> str:
    """A file name for a learner id, the same on every disk: the id itself when it is a
    lower-case portable name, else its safe characters, "+" and a hash of the id. No pure name
    holds a "+", and distinct ids give distinct hashes: two ids never share a stem, with or
    without case (see `file_stems`, which checks it)."""
    if _PURE.fullmatch(learner) and not _RESERVED.fullmatch(learner) and \
            not learner.endswith("."):
        return learner
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", learner).strip(".")[:60] or "learner"
    return f"{safe}+{hashlib.sha256(learner.encode('utf-8', 'replace')).hexdigest()[:12]}"


def file_stems(learners: list[str]) -> dict[str, str]:
    """Each id's file stem, unique under case folding; a stem two ids would share (a hash
    collision) gets the longer hash, then a counter: never one file for two learners."""
    out: dict[str, str] = {}
    taken: set[str] = set()
    for learner in dict.fromkeys(learners):
        stem = file_stem(learner)
        if fold(stem) in taken:
            stem = f"{stem}+{hashlib.sha256(learner.encode('utf-8', 'replace')).hexdigest()}"
        k = 2
        while fold(stem) in taken:
            stem, k = f"{stem}+{k}", k + 1
        taken.add(fold(stem))
        out[learner] = stem
    return out
