"""The one reader of foreign JSON: a byte cap and a nesting cap checked before anything is parsed,
so that no file a user hands us can exhaust memory or the stack (no RecursionError possible).

Every JSON file the package reads from outside (config.json, a safetensors header and its index,
tokenizer.json, a checkpoint's metadata, a log line) goes through `parse_json` or `read_json`:
one ValueError naming the file and what is wrong, or the parsed value.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

MAX_DEPTH = 64  # nesting of arrays and objects; real files nest a handful of levels
MAX_BYTES = 64 * 2**20  # the default cap: a tokenizer.json of 250k tokens is ~20 MB
_ESCAPE = re.compile(rb"\\.", re.DOTALL)  # an escape pair: \" and \\ are no quote, no backslash


def nesting(raw: bytes) -> int:
    """The deepest nesting of arrays and objects in `raw` (brackets inside strings skipped), by
    linear scans with no recursion: what `json.loads` would recurse into. Escape pairs are
    dropped first, so the quotes left alternate between opening and closing a string."""
    bare = np.frombuffer(_ESCAPE.sub(b"", raw), dtype=np.uint8)  # (N,) escapes removed
    marks = bare[np.isin(bare, np.frombuffer(b'"[]{}', dtype=np.uint8))]  # (M,) quotes, brackets
    quote = marks == ord('"')  # (M,) what remains of a string is its two quotes
    inside = (np.cumsum(quote, dtype=np.int64) - quote) % 2 == 1  # (M,) within a string
    opens = (marks == ord("[")) | (marks == ord("{"))  # (M,)
    closes = (marks == ord("]")) | (marks == ord("}"))  # (M,)
    step = np.where(inside, 0, opens.astype(np.int64) - closes)  # (M,) +1, -1 or 0
    return int(np.cumsum(step).max(initial=0))


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def parse_json(raw: bytes, where: str, *, max_bytes: int = MAX_BYTES,
               max_depth: int = MAX_DEPTH) -> object:
    """The value of the JSON text `raw` (UTF-8 bytes), or one ValueError that starts with
    `where` (e.g. "'model/config.json'") and says what is wrong: too large, nested deeper than
    `max_depth`, not UTF-8, not JSON, or NaN/Infinity (which JSON does not have)."""
    if len(raw) > max_bytes:
        raise ValueError(f"{where} holds more than the {max_bytes:,} bytes of JSON this "
                         "reader accepts")
    depth = nesting(raw)
    if depth > max_depth:
        raise ValueError(f"{where} nests JSON {depth} levels deep, more than the {max_depth} "
                         "this reader accepts")
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except UnicodeDecodeError:
        raise ValueError(f"{where} is not UTF-8 text") from None
    except (ValueError, RecursionError) as e:  # RecursionError cannot come: depth is capped
        detail = e.msg if isinstance(e, json.JSONDecodeError) else type(e).__name__
        raise ValueError(f"{where} is not JSON ({detail})") from None


def read_json(path: str | Path, *, max_bytes: int = MAX_BYTES,
              max_depth: int = MAX_DEPTH) -> object:
    """The JSON value of file `path`, read through `parse_json`: its size is checked before it
    is read, and every error is one ValueError naming the file."""
    path = Path(path)
    where = f"'{path}'"
    try:
        with open(path, "rb") as f:
            raw = f.read(max_bytes + 1)  # never more than the cap, whatever the file's size
    except OSError as e:
        raise ValueError(f"{where} cannot be read ({e.strerror or type(e).__name__})") from None
    return parse_json(raw, where, max_bytes=max_bytes, max_depth=max_depth)


__all__ = ["MAX_BYTES", "MAX_DEPTH", "nesting", "parse_json", "read_json"]
