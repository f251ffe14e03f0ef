"""Learners' names as data: one canonical id (Unicode NFC), its case-folded key where a disk
ignores case, and the same text with every control character escaped for files and terminals.

The roster match, the journal, every file name and every export use `canonical`; two learners
whose keys (`fold`) or file names are the same are reported and kept apart, never merged.
"""

from __future__ import annotations

import unicodedata

# what a terminal or a viewer may obey instead of showing: C0, DEL, C1, and format characters
# (bidirectional overrides, zero-width joiners): escaped wherever a name is shown
_CONTROL = ("Cc", "Cf", "Zl", "Zp")


def canonical(name: str) -> str:
    """The one form of a learner's id: Unicode NFC (a zip made on macOS stores NFD names)."""
    return unicodedata.normalize("NFC", name)


def fold(name: str) -> str:
    """The key two ids are compared by where a disk ignores case (macOS, Windows)."""
    return unicodedata.normalize("NFC", canonical(name).casefold())


def escape_controls(text: object) -> str:
    """`text` with every control or format character written as a \\x, \\u escape."""
    out = []
    for ch in str(text):
        if unicodedata.category(ch) in _CONTROL:
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if
                       code < 0x10000 else f"\\U{code:08x}")
        else:
            out.append(ch)
    return "".join(out)
