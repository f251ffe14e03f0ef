"""The channel between the grader and its sandbox: length-prefixed frames of JSON and raw arrays.
Never pickle: a frame holds only data, and the grader checks every field, dtype and size it reads.

A frame is 8 bytes of little-endian length, then a 4-byte header length, the header (UTF-8
JSON: the message, and the byte length of each array blob) and the blobs. A learner's value is
encoded as a tagged JSON list ("a" arrays, "t" tuples, "o" an opaque object's type and repr, ...);
an outcome is a value or a record ("R" raised, "P" changed in place, "N" not callable).
Everything the sandbox sends is the learner's to forge: `Conversation` holds each frame to a
strict schema and to the order the worker sends them in, within a budget of frames and bytes.
"""

from __future__ import annotations

import json
import numbers
import os
import re
import select
import struct
import time

import numpy as np

from ..exercises.outcomes import InPlace, NotCallable, Opaque, Raised
from .statuses import Row

MAX_FRAME = 512 * 2**20  # bytes: a reply larger than this is refused (the grader's memory)
MAX_HEADER = 64 * 2**20
MAX_DEPTH = 64  # nesting of a learner's tuples and lists
MAX_ELEMENTS = 2**28  # elements of one array that comes back
MAX_INT = 2**63  # integers that travel fit in int64
MAX_TEXT = 100_000  # characters of a string that travels
LONE_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")  # a JSON escape of half a UTF-16 pair
NUMERIC_KINDS = "biufc"  # bool, int, unsigned, float, complex: the only dtypes that travel
# the dtype strings that may come back, in either byte order: numpy's .str of each plain type
DTYPES = frozenset(np.dtype(c).newbyteorder(o).str for c in "?bBhHiIlLqQefdFD" for o in "<>")


PROTOCOL_ERROR = Row.PROTOCOL_ERROR  # the status of a learner whose sandbox broke the protocol


def tampering(why: str) -> str:
    """The message of a protocol error row: what the teacher reads."""
    return (f"[protocol error] the sandbox's reply broke the grader's protocol ({why[:200]}): "
            "the learner's code wrote on the grader's channel; nothing it sent counts, and no "
            "exercise is passed")


class ChannelError(Exception):
    """The other side closed the channel, sent something malformed, or took too long."""


class Deadline(ChannelError):
    """No complete frame arrived before the deadline."""


class Tampered(ChannelError):
    """A frame from the sandbox breaks the protocol: the learner's code wrote on the channel."""


# ----------------------------------------------------------------------------------------------
# Values: a learner's returned data, as tagged JSON plus blobs.


def encode_value(value: object, blobs: list[bytes], depth: int = 0) -> list:
    """`value` as a tagged JSON list; arrays append their bytes to `blobs`."""
    if value is None:
        return ["n"]
    if isinstance(value, Opaque):
        return ["o", str(value.type_name)[:100], str(value.text)[:100]]
    if isinstance(value, bool):
        return ["b", value]
    if type(value) is int:
        return ["i", value] if -MAX_INT <= value < MAX_INT else ["f", float(value)]
    if type(value) is float:
        return ["f", value]
    if type(value) is str:
        return ["s", value[:MAX_TEXT]]
    if type(value) is complex:
        return ["c", value.real, value.imag]
    if isinstance(value, np.generic) and value.dtype.str in DTYPES:
        blobs.append(np.asarray(value).tobytes())
        return ["g", value.dtype.str, len(blobs) - 1]
    if type(value) is np.ndarray and value.dtype.str in DTYPES:
        blobs.append(np.ascontiguousarray(value).tobytes())
        return ["a", value.dtype.str, list(value.shape), len(blobs) - 1]
    if isinstance(value, tuple | list) and depth < MAX_DEPTH:
        items = [encode_value(v, blobs, depth + 1) for v in value]
        return ["t" if isinstance(value, tuple) else "l", items]
    if isinstance(value, numbers.Integral) and type(value) is not bool:
        return encode_value(int(value), blobs, depth)
    if isinstance(value, numbers.Real):
        return ["f", float(value)]
    return ["o", type(value).__name__, _repr(value)]


def _repr(value: object) -> str:
    try:
        return repr(value)[:60]
    except Exception:  # a learner's __repr__ may raise
        return "?"


def _dtype(text: object) -> np.dtype:
    if not isinstance(text, str) or text not in DTYPES:
        raise Tampered(f"a dtype that is not a plain number type: {str(text)[:20]!r}")
    return np.dtype(text)


def _blob(blobs: list[bytes], index: object) -> bytes:
    if type(index) is not int or not 0 <= index < len(blobs):
        raise Tampered(f"a bad blob index {str(index)[:20]!r}")
    return blobs[index]


def _number(x: object) -> bool:
    """A JSON number that converts to a float: an int of int64's range, or a float."""
    return type(x) is float or (type(x) is int and -MAX_INT <= x < MAX_INT)


def decode_value(tree: object, blobs: list[bytes], opaque: type = Opaque,
                 depth: int = 0) -> object:
    """The value `encode_value` encoded; `opaque(type_name, text)` stands for an object.
    Raises `Tampered` for anything `encode_value` cannot have written."""
    if type(tree) is not list or not tree or depth > MAX_DEPTH + 1:
        raise Tampered("a value is malformed")
    tag, rest = tree[0], tree[1:]
    if tag == "n" and not rest:
        return None
    if tag == "b" and len(rest) == 1 and type(rest[0]) is bool:
        return rest[0]
    if tag == "i" and len(rest) == 1 and type(rest[0]) is int and _number(rest[0]):
        return rest[0]
    if tag == "f" and len(rest) == 1 and _number(rest[0]):
        return float(rest[0])
    if tag == "s" and len(rest) == 1 and type(rest[0]) is str and len(rest[0]) <= MAX_TEXT:
        return rest[0]
    if tag == "c" and len(rest) == 2 and all(_number(x) for x in rest):
        return complex(float(rest[0]), float(rest[1]))
    if tag == "g" and len(rest) == 2:
        dt = _dtype(rest[0])
        data = _blob(blobs, rest[1])
        if len(data) != dt.itemsize:
            raise Tampered("a scalar has the wrong size")
        return np.frombuffer(data, dtype=dt)[0]
    if tag == "a" and len(rest) == 3:
        return _decode_array(rest, blobs)
    if tag in ("t", "l") and len(rest) == 1 and type(rest[0]) is list:
        items = [decode_value(v, blobs, opaque, depth + 1) for v in rest[0]]
        return tuple(items) if tag == "t" else items
    if tag == "o" and len(rest) == 2 and all(type(x) is str and len(x) <= 200 for x in rest):
        return opaque(rest[0][:100], rest[1][:100])
    raise Tampered(f"a value tagged {str(tag)[:10]!r} is malformed")


def _decode_array(rest: list, blobs: list[bytes]) -> np.ndarray:
    dt = _dtype(rest[0])
    shape = rest[1]
    if type(shape) is not list or len(shape) > 32 or \
            not all(type(n) is int and 0 <= n <= MAX_ELEMENTS for n in shape):
        raise Tampered("an array has a bad shape")
    count = 1
    for n in shape:  # Python's integers: the product cannot overflow, and stops early
        count *= n
        if count > MAX_ELEMENTS:
            raise Tampered(f"an array of more than {MAX_ELEMENTS} elements")
    data = _blob(blobs, rest[2])
    if count * dt.itemsize != len(data):
        raise Tampered("an array's bytes do not match its shape")
    return np.frombuffer(data, dtype=dt).reshape(shape).copy()  # writable, owned


def answer_cap(input_bytes: int) -> int:
    """Bytes of arrays one answer may send back: the answers are about the questions' size."""
    return 16 * 2**20 + 4 * input_bytes


def encode_outcome(outcome: object, blobs: list[bytes]) -> list:
    """One call's outcome (`outcomes.run`): a record, or the returned value."""
    if isinstance(outcome, Raised):
        return ["R", *(str(x)[:2000] for x in outcome)]
    if isinstance(outcome, InPlace):
        return ["P", int(outcome.position)]
    if isinstance(outcome, NotCallable):
        return ["N", str(outcome.type_name)[:100], str(outcome.text)[:100]]
    return ["v", encode_value(outcome, blobs)]


def decode_outcome(tree: object, blobs: list[bytes], n_args: int) -> object:
    """The outcome `encode_outcome` encoded, for a function of `n_args` arguments."""
    if type(tree) is not list or not tree:
        raise Tampered("an outcome is malformed")
    tag, rest = tree[0], tree[1:]
    if tag == "R" and len(rest) == 3 and all(type(x) is str and len(x) <= 2000 for x in rest):
        return Raised(*rest)
    if tag == "P" and len(rest) == 1 and type(rest[0]) is int and 0 <= rest[0] < n_args:
        return InPlace(rest[0])
    if tag == "N" and len(rest) == 2 and all(type(x) is str and len(x) <= 100 for x in rest):
        return NotCallable(*rest)
    if tag == "v" and len(rest) == 1:
        return decode_value(rest[0], blobs)
    raise Tampered("an outcome is malformed")


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
        raise Tampered("a frame is too short")
    (n,) = struct.unpack("<I", payload[:4])
    if n > min(MAX_HEADER, len(payload) - 4):
        raise Tampered("a frame's header is too long")
    try:
        text = payload[4:4 + n].decode()
        header = json.loads(text)
        if LONE_SURROGATE.search(text):  # JSON may spell text that no file can hold
            header = _clean(header)
    except (ValueError, RecursionError):
        raise Tampered("a frame's header is not JSON") from None
    if type(header) is not dict or type(header.get("msg")) is not dict or \
            type(header.get("blobs")) is not list:
        raise Tampered("a frame's header is malformed")
    blobs, at = [], 4 + n
    for size in header["blobs"]:
        if type(size) is not int or size < 0 or at + size > len(payload):
            raise Tampered("a frame's blobs are malformed")
        blobs.append(payload[at:at + size])
        at += size
    if at != len(payload):
        raise Tampered("a frame has trailing bytes")
    return header["msg"], blobs


def _clean(tree: object) -> object:
    """`tree` with every lone surrogate of its strings escaped (a CSV could not hold them)."""
    if isinstance(tree, str):
        return tree.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(tree, list):
        return [_clean(x) for x in tree]
    if isinstance(tree, dict):
        return {_clean(k): _clean(v) for k, v in tree.items()}
    return tree


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
        raise Tampered(f"a reply of {size} bytes is larger than the limit of {limit}")
    return head + read_exact(fd, size, deadline)


def message(frame: bytes) -> tuple[dict, list[bytes]]:
    """The message and blobs of a raw frame read by `read_frame`."""
    return unpack(frame[8:])


# ----------------------------------------------------------------------------------------------
# The conversation: every frame from the sandbox, held to its schema and its place in the order.


def _nb_int(x: object, n: int) -> bool:
    return type(x) is int and 0 <= x < n


def _text_ok(x: object, n: int) -> bool:
    return type(x) is str and len(x) <= n


SCHEMA = {  # op -> the exact keys of its frame
    "ready": {"op"}, "error": {"op", "text"}, "bye": {"op"},
    "ran": {"op", "nb", "errors", "stopped", "functions", "seconds"},
    "result": {"op", "nb", "ex", "call", "outcome", "delegated", "seconds"},
    "exercise": {"op", "nb", "ex"}, "notebook": {"op", "nb"},
    "stopped": {"op", "nb", "ex", "call", "why", "phase"},
}


class Conversation:
    """The grader's side of one sandbox's reply: `take` each frame as it arrives; it raises
    `Tampered` at the first frame that breaks the schema, the order or the budget.

    `plan[i]` lists notebook i's exercises as (function name, number of cases, number of
    arguments): the grader, not a frame, decides what is called and how often.
    """

    def __init__(self, plan: list[list[tuple[str, int, int]]], max_bytes: int) -> None:
        self.plan, self.left = plan, max_bytes
        self.frames_left = 3 + sum((len(ex) + 1) * (3 + len(ex) + sum(c for _, c, _ in ex))
                                   for ex in plan)
        self.i, self.k, self.j, self.start = 0, 0, 0, 0
        self.phase = "start"  # start, attempt, calls, ended, last, over
        self.functions: dict = {}

    def budget(self) -> int:
        """The largest frame that may still come."""
        return max(0, min(MAX_FRAME, self.left))

    def take(self, size: int, msg: dict, blobs: list[bytes]) -> None:
        self.left -= size
        self.frames_left -= 1
        if self.left < 0 or self.frames_left < 0:
            raise Tampered("more frames or bytes than the exercises can need")
        op = msg.get("op")
        if op not in SCHEMA or set(msg) != SCHEMA[op]:
            raise Tampered(f"a frame of an unknown form (op {str(op)[:20]!r})")
        if op in ("ready", "error", "bye"):
            return self._take_plain(op, msg)
        if msg["nb"] != self.i or type(msg["nb"]) is not int or self.phase in ("start", "last",
                                                                               "over"):
            raise Tampered(f"a {op!r} frame out of order")
        getattr(self, "_take_" + op)(msg, blobs)

    def _take_plain(self, op: str, msg: dict) -> None:
        if op == "error" and self.phase == "start" and _text_ok(msg["text"], 1000):
            self.phase = "over"
        elif op == "ready" and self.phase == "start":
            self.phase = "attempt" if self.plan else "last"
        elif op == "bye" and self.phase == "last":
            self.phase = "over"
        else:
            raise Tampered(f"a {op!r} frame out of order")

    def _take_ran(self, msg: dict, _blobs: list) -> None:
        fns = {fn for fn, _, _ in self.plan[self.i]}
        errors, functions = msg["errors"], msg["functions"]
        if self.phase != "attempt" or type(errors) is not list or len(errors) > 1000 or \
                not all(type(e) is list and len(e) == 2 and type(e[0]) is int and
                        0 < e[0] < MAX_INT and _text_ok(e[1], 3000) for e in errors) or \
                not (msg["stopped"] is None or _text_ok(msg["stopped"], 1000)) or \
                type(functions) is not dict or set(functions) != fns or \
                not all(_text_ok(v, 200) for v in functions.values()) or \
                not _number(msg["seconds"]):
            raise Tampered("a malformed or repeated 'ran' frame")
        self.phase, self.k, self.j, self.functions = "calls", self.start, 0, functions

    def _take_result(self, msg: dict, blobs: list) -> None:
        ex = self.plan[self.i]
        if self.phase != "calls" or msg["ex"] != self.k or type(msg["ex"]) is not int or \
                msg["call"] != self.j or type(msg["call"]) is not int or \
                self.k >= len(ex) or self.j >= ex[self.k][1] or \
                type(msg["delegated"]) is not list or len(msg["delegated"]) > 64 or \
                not all(_text_ok(d, 300) for d in msg["delegated"]) or \
                not _number(msg["seconds"]):
            raise Tampered("a malformed or unexpected 'result' frame")
        decode_outcome(msg["outcome"], blobs, ex[self.k][2])  # raises Tampered if malformed
        self.j += 1

    def _take_exercise(self, msg: dict, _blobs: list) -> None:
        ex = self.plan[self.i]
        if self.phase != "calls" or msg["ex"] != self.k or type(msg["ex"]) is not int or \
                self.k >= len(ex):
            raise Tampered("an unexpected 'exercise' frame")
        fn, cases, _ = ex[self.k]
        if self.j != (cases if self.functions.get(fn) == "ok" else 0):
            raise Tampered(f"an 'exercise' frame after {self.j} of {cases} answers")
        self.k, self.j = self.k + 1, 0

    def _take_stopped(self, msg: dict, _blobs: list) -> None:
        why_ok = msg["why"] in ("time", "exited")
        n = len(self.plan[self.i])
        if self.phase == "attempt" and why_ok and msg["phase"] == "run" and \
                msg["ex"] is None and msg["call"] is None:
            self.phase = "ended"
        elif self.phase == "calls" and why_ok and msg["phase"] == "call" and \
                msg["ex"] == self.k and msg["call"] == self.j and self.k < n:
            self.start = self.k + 1
            self.phase = "attempt" if self.start < n else "ended"
        else:
            raise Tampered("an unexpected 'stopped' frame")

    def _take_notebook(self, msg: dict, _blobs: list) -> None:
        if not (self.phase == "ended" or (self.phase == "calls" and
                                          self.k == len(self.plan[self.i]))):
            raise Tampered("a notebook that ended before its exercises")
        self.i, self.start = self.i + 1, 0
        self.phase = "attempt" if self.i < len(self.plan) else "last"
