"""The channel between the grader and its sandbox: length-prefixed frames of JSON and raw arrays.
Never pickle: a frame holds only data, and the grader checks every dtype and size it decodes.

A frame is 8 bytes of little-endian length, then a 4-byte header length, the header (UTF-8
JSON: the message, and the byte length of each array blob) and the blobs. A learner's value is
encoded as a tagged JSON list ("a" arrays, "t" tuples, "o" an opaque object's type and repr, ...).
"""

from __future__ import annotations

import json
import numbers
import os
import select
import struct
import time

import numpy as np

MAX_FRAME = 512 * 2**20  # bytes: a reply larger than this is refused (the grader's memory)
MAX_HEADER = 64 * 2**20
MAX_DEPTH = 64  # nesting of a learner's tuples and lists
NUMERIC_KINDS = "biufc"  # bool, int, unsigned, float, complex: the only dtypes that travel


class ChannelError(Exception):
    """The other side closed the channel, sent something malformed, or took too long."""


class Deadline(ChannelError):
    """No complete frame arrived before the deadline."""


# ----------------------------------------------------------------------------------------------
# Values: a learner's returned data, as tagged JSON plus blobs.


def encode_value(value: object, blobs: list[bytes], depth: int = 0) -> list:
    """`value` as a tagged JSON list; arrays append their bytes to `blobs`."""
    if value is None:
        return ["n"]
    if isinstance(value, bool):
        return ["b", value]
    if type(value) is int:
        return ["i", value]
    if type(value) is float:
        return ["f", value]
    if type(value) is str:
        return ["s", value[:100_000]]
    if type(value) is complex:
        return ["c", value.real, value.imag]
    if isinstance(value, np.generic) and value.dtype.kind in NUMERIC_KINDS:
        blobs.append(np.asarray(value).tobytes())
        return ["g", value.dtype.str, len(blobs) - 1]
    if type(value) is np.ndarray and value.dtype.kind in NUMERIC_KINDS:
        blobs.append(np.ascontiguousarray(value).tobytes())
        return ["a", value.dtype.str, list(value.shape), len(blobs) - 1]
    if isinstance(value, tuple | list) and depth < MAX_DEPTH:
        items = [encode_value(v, blobs, depth + 1) for v in value]
        return ["t" if isinstance(value, tuple) else "l", items]
    if isinstance(value, numbers.Integral) and type(value) is not bool:
        return ["i", int(value)]
    if isinstance(value, numbers.Real):
        return ["f", float(value)]
    return ["o", type(value).__name__, _repr(value)]


def _repr(value: object) -> str:
    try:
        return repr(value)[:60]
    except Exception:  # a learner's __repr__ may raise
        return "?"


def _dtype(text: object) -> np.dtype:
    if not isinstance(text, str) or len(text) > 8:
        raise ChannelError(f"bad dtype {text!r}")
    try:
        dt = np.dtype(text)
    except TypeError:
        raise ChannelError(f"bad dtype {text!r}") from None
    if dt.kind not in NUMERIC_KINDS or dt.hasobject or dt.fields or dt.subdtype:
        raise ChannelError(f"dtype {text!r} is not a plain number type")
    return dt


def _blob(blobs: list[bytes], index: object) -> bytes:
    if type(index) is not int or not 0 <= index < len(blobs):
        raise ChannelError(f"bad blob index {index!r}")
    return blobs[index]


def decode_value(tree: object, blobs: list[bytes], opaque: type, depth: int = 0) -> object:
    """The value `encode_value` encoded; `opaque(type_name, text)` stands for an object."""
    if not isinstance(tree, list) or not tree or depth > MAX_DEPTH + 1:
        raise ChannelError("a value is malformed")
    tag, rest = tree[0], tree[1:]
    simple = {"n": (0, None), "b": (1, bool), "i": (1, int), "f": (1, (int, float)),
              "s": (1, str)}
    if tag in simple:
        n, kind = simple[tag]
        if len(rest) != n or (n and not isinstance(rest[0], kind)):
            raise ChannelError(f"a value tagged {tag!r} is malformed")
        return float(rest[0]) if tag == "f" else (rest[0] if n else None)
    if tag == "c" and len(rest) == 2 and all(isinstance(x, int | float) for x in rest):
        return complex(rest[0], rest[1])
    if tag == "g" and len(rest) == 2:
        dt = _dtype(rest[0])
        data = _blob(blobs, rest[1])
        if len(data) != dt.itemsize:
            raise ChannelError("a scalar has the wrong size")
        return np.frombuffer(data, dtype=dt)[0]
    if tag == "a" and len(rest) == 3:
        return _decode_array(rest, blobs)
    if tag in ("t", "l") and len(rest) == 1 and isinstance(rest[0], list):
        items = [decode_value(v, blobs, opaque, depth + 1) for v in rest[0]]
        return tuple(items) if tag == "t" else items
    if tag == "o" and len(rest) == 2 and all(isinstance(x, str) for x in rest):
        return opaque(rest[0][:100], rest[1][:100])
    raise ChannelError(f"unknown value tag {tag!r}")


def _decode_array(rest: list, blobs: list[bytes]) -> np.ndarray:
    dt = _dtype(rest[0])
    shape = rest[1]
    if not isinstance(shape, list) or len(shape) > 32 or \
            not all(type(n) is int and n >= 0 for n in shape):
        raise ChannelError("an array has a bad shape")
    data = _blob(blobs, rest[2])
    if int(np.prod(shape, dtype=np.int64)) * dt.itemsize != len(data):
        raise ChannelError("an array's bytes do not match its shape")
    return np.frombuffer(data, dtype=dt).reshape(shape).copy()  # writable, owned


# ----------------------------------------------------------------------------------------------
# Frames.


def pack(message: dict, blobs: list[bytes] = ()) -> bytes:
    """One frame: the JSON `message` and its blobs."""
    header = json.dumps({"msg": message, "blobs": [len(b) for b in blobs]}).encode()
    payload = [struct.pack("<I", len(header)), header, *blobs]
    size = sum(len(p) for p in payload)
    return struct.pack("<Q", size) + b"".join(payload)


def unpack(payload: bytes) -> tuple[dict, list[bytes]]:
    """The message and blobs of one frame's payload (without its 8-byte length)."""
    if len(payload) < 4:
        raise ChannelError("a frame is too short")
    (n,) = struct.unpack("<I", payload[:4])
    if n > min(MAX_HEADER, len(payload) - 4):
        raise ChannelError("a frame's header is too long")
    try:
        header = json.loads(payload[4:4 + n].decode())
    except (ValueError, RecursionError):
        raise ChannelError("a frame's header is not JSON") from None
    if not isinstance(header, dict) or not isinstance(header.get("msg"), dict) or \
            not isinstance(header.get("blobs"), list):
        raise ChannelError("a frame's header is malformed")
    blobs, at = [], 4 + n
    for size in header["blobs"]:
        if type(size) is not int or size < 0 or at + size > len(payload):
            raise ChannelError("a frame's blobs are malformed")
        blobs.append(payload[at:at + size])
        at += size
    if at != len(payload):
        raise ChannelError("a frame has trailing bytes")
    return header["msg"], blobs


def write_frame(fd: int, frame: bytes) -> None:
    """Writes all of `frame` to the file descriptor `fd` (blocking)."""
    view = memoryview(frame)
    while view:
        view = view[os.write(fd, view):]


def read_exact(fd: int, n: int, deadline: float | None) -> bytes:
    """Exactly `n` bytes from `fd`, before `deadline` (time.monotonic(); None: no limit)."""
    chunks, left = [], n
    while left:
        if deadline is not None:
            wait = deadline - time.monotonic()
            if wait <= 0 or not select.select([fd], [], [], wait)[0]:
                raise Deadline("no reply before the time limit")
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise ChannelError("the other side closed the channel")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_frame(fd: int, deadline: float | None = None, limit: int = MAX_FRAME) -> bytes:
    """One frame's raw bytes (length included), before `deadline`; refuses frames over `limit`."""
    head = read_exact(fd, 8, deadline)
    (size,) = struct.unpack("<Q", head)
    if size > limit:
        raise ChannelError(f"a reply of {size} bytes is larger than the limit of {limit}")
    return head + read_exact(fd, size, deadline)


def message(frame: bytes) -> tuple[dict, list[bytes]]:
    """The message and blobs of a raw frame read by `read_frame`."""
    return unpack(frame[8:])
