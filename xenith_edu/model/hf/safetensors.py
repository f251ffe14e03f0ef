"""The safetensors format in NumPy: an 8-byte little-endian header length, a JSON header, raw data.
NumPy has no bfloat16, so the reader is ours: bfloat16 and float16 become float32 exactly.

The reader trusts nothing in the file: every field of the header is checked, and a damaged or
truncated file raises one ValueError naming the file and what is wrong with it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from ...tools.boundedjson import parse_json
from ...tools.util import atomic_write

# The format's dtypes as NumPy reads their bytes (little-endian). BF16 is read as its 16 bits.
DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8", "I32": "<i4",
          "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "?"}
WRITES = {np.dtype("<f8"): "F64", np.dtype("<f4"): "F32", np.dtype("<f2"): "F16",
          np.dtype("<i8"): "I64", np.dtype("<i4"): "I32"}
# The JSON header's limit, in bytes: the format allows 100 MB, which Python's objects would make
# gigabytes; a real model's header is under 1 MB (a tensor takes ~100 bytes of it)
MAX_HEADER = 16 * 2**20


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 values given as their uint16 bits -> float32, exactly: the bits become the high
    half of a float32 (bfloat16 is float32 with the low 16 bits of the mantissa dropped)."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _bad(path: Path, why: str) -> ValueError:
    return ValueError(f"safetensors file '{path}' {why}")


def read_header(path: str | Path) -> tuple[dict, int]:
    """The checked header {name: (dtype, shape, begin, end)} and the offset of the data."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            if n < 0 or n > size - 8:
                raise _bad(path, f"is truncated or not safetensors (header length "
                                 f"{n if n >= 0 else 'missing'}, file of {size} bytes)")
            if n > MAX_HEADER:
                raise _bad(path, f"has a header of {n:,} bytes, more than the {MAX_HEADER:,} "
                                 "this reader accepts (real models have under 1 MB)")
            raw = f.read(n)
    except OSError as e:
        raise _bad(path, f"cannot be read ({e.strerror})") from e
    try:
        header = parse_json(raw, "its header", max_bytes=MAX_HEADER)  # depth capped: no recursion
    except ValueError as e:
        raise _bad(path, f"is damaged: {e}") from None
    if not isinstance(header, dict):
        raise _bad(path, "has a header that is not a JSON object")
    header.pop("__metadata__", None)
    entries = {name: _entry(path, name, e) for name, e in header.items()}
    _check_layout(path, entries, size - 8 - n)
    return entries, 8 + n


def _entry(path: Path, name: str, e: object) -> tuple[str, tuple[int, ...], int, int]:
    """One tensor's (dtype, shape, begin, end), each field checked."""
    if not isinstance(e, dict) or set(e) != {"dtype", "shape", "data_offsets"}:
        raise _bad(path, f"has tensor '{name}' without exactly dtype, shape, data_offsets")
    dtype, shape, offsets = e["dtype"], e["shape"], e["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPES:  # a list or object is not hashable
        raise _bad(path, f"has tensor '{name}' of unknown dtype {dtype!r}")

    def ints(v: object, n: int | None) -> bool:
        return (isinstance(v, list) and (n is None or len(v) == n)
                and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in v))

    if not ints(shape, None) or not ints(offsets, 2) or offsets[0] > offsets[1]:
        raise _bad(path, f"has tensor '{name}' with a bad shape {shape!r} or data_offsets "
                         f"{offsets!r}")
    nbytes = math.prod(shape) * np.dtype(DTYPES[dtype]).itemsize
    if offsets[1] - offsets[0] != nbytes:
        raise _bad(path, f"has tensor '{name}' whose data_offsets {offsets} hold "
                         f"{offsets[1] - offsets[0]} bytes, but {dtype} {shape} needs {nbytes}")
    return dtype, tuple(shape), offsets[0], offsets[1]


def _check_layout(path: Path, entries: dict, data_size: int) -> None:
    """The tensors tile the data exactly: no overlap, no hole, nothing past the end."""
    spans = sorted((b, e, name) for name, (_, _, b, e) in entries.items())
    at = 0
    for b, e, name in spans:
        if b != at:
            raise _bad(path, f"has tensor '{name}' at byte {b} of the data, expected {at} "
                             "(overlapping or missing data)")
        at = e
    if at > data_size:
        raise _bad(path, f"is truncated: its header describes {at} bytes of data, the file "
                         f"holds {data_size}")
    if at < data_size:
        raise _bad(path, f"has {data_size - at} bytes of data that no tensor describes")


def read_safetensors(path: str | Path, names: set[str] | None = None) -> dict[str, np.ndarray]:
    """The tensors of a safetensors file (only `names`, if given), as NumPy arrays.

    BF16 and F16 come back as float32, exactly; the other dtypes as they are stored.
    """
    path = Path(path)
    entries, start = read_header(path)
    with open(path, "rb") as f:
        return {name: read_tensor(f, path, name, entries[name], start) for name in entries
                if names is None or name in names}


def read_tensor(f, path: Path, name: str, entry: tuple, start: int) -> np.ndarray:
    """One tensor of open file `f` (at `path`), from its checked header `entry` (dtype, shape,
    begin, end) and the data's offset `start`: BF16 and F16 as float32, exactly."""
    dtype, shape, b, e = entry
    f.seek(start + b)
    a = np.empty(shape, dtype=DTYPES[dtype])  # the file's bytes land here, read once
    if f.readinto(a.reshape(-1).view(np.uint8)) != e - b:
        raise _bad(path, f"is truncated inside tensor '{name}'")
    if dtype == "BF16":
        a = bf16_to_f32(a)
    elif dtype == "F16":
        a = a.astype(np.float32)  # every float16 is a float32: exact
    return a if a.dtype.isnative else a.astype(a.dtype.newbyteorder("="))  # ours, writable


def write_safetensors(path: str | Path, tensors: dict[str, np.ndarray],
                      metadata: dict[str, str] | None = None) -> None:
    """Write `tensors` (float64, float32, float16, int64 or int32) atomically, in name order."""
    layout = {name: (np.asarray(a).dtype, np.shape(a)) for name, a in tensors.items()}
    write_tensors(path, layout, tensors.__getitem__, metadata)


def write_tensors(path: str | Path, layout: dict[str, tuple[np.dtype, tuple[int, ...]]],
                  tensor: Callable[[str], np.ndarray],
                  metadata: dict[str, str] | None = None,
                  progress: Callable[[str], None] | None = None) -> None:
    """Write a safetensors file atomically, one tensor at a time: `layout` gives each name's
    dtype and shape (the header is written first), `tensor(name)` makes that tensor when its
    turn comes, so the peak memory is one tensor, not the file. `progress(name)` after each."""
    header: dict = {"__metadata__": dict(metadata)} if metadata else {}
    at = 0
    for name in sorted(layout):
        dtype, shape = np.dtype(layout[name][0]).newbyteorder("<"), tuple(layout[name][1])
        if dtype not in WRITES:
            raise TypeError(f"tensors['{name}'] has dtype {dtype}, which this writer does "
                            f"not store; use one of {sorted(str(d) for d in WRITES)}")
        nbytes = math.prod(shape) * dtype.itemsize
        header[name] = {"dtype": WRITES[dtype], "shape": list(shape),
                        "data_offsets": [at, at + nbytes]}
        at += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned, as the library writes it

    def write(f) -> None:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for name in sorted(layout):
            want = header[name]
            a = np.ascontiguousarray(tensor(name), dtype=DTYPES[want["dtype"]])
            if list(a.shape) != want["shape"]:
                raise ValueError(f"tensor '{name}' has shape {a.shape}, the layout says "
                                 f"{tuple(want['shape'])}")
            f.write(a.reshape(-1).view(np.uint8).data)  # its bytes, not a copy
            if progress is not None:
                progress(name)

    atomic_write(path, write)


def tensor_bytes(entries: Iterable[tuple[str, tuple[int, ...], int, int]]) -> int:
    """The bytes of data that header entries (dtype, shape, begin, end) describe."""
    return sum(e - b for _, _, b, e in entries)
