"""Checkpoints that lose nothing: parameters, AdamW moments, step, random state, config, vocab
(or, for a BPE model, its tokenizer.json).

One .npz file, written atomically (temporary file, then rename), read with allow_pickle=False
and checked on load, so that a resumed run continues bit for bit where the saved one stopped.
A damaged file is refused with one ValueError naming it: every array's size is checked against
the file before it is allocated, and every array against the checksum its metadata records.
"""

from __future__ import annotations

import json
import math
import struct
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..model import CharTokenizer, Config, param_shapes, tokenizer_of
from ..model.adapters import Adapters, LoraSpec, adapter_shapes, merged
from ..tools.boundedjson import MAX_BYTES, parse_json
from ..tools.util import atomic_write, one_line
from .config import TrainConfig

FORMAT = "xenith-edu checkpoint 1"
GROUPS = ("params", "m", "v")  # parameters, AdamW first and second moments
_BIT_GENERATORS = ("PCG64", "PCG64DXSM")  # the generators whose state is plain JSON
_AGAIN = "use a checkpoint written by `xenith-edu train`"
_PIECE = 2**24  # bytes read at a time from a checkpoint's member
_INTACT = "use an intact checkpoint or train again"
# what the zip and .npy readers raise on a damaged file: a bad directory or CRC, a compression
# method or an "encrypted" flag that bits flipped into, an empty member, a garbled header
_ZIP_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, RuntimeError,
               AttributeError, MemoryError, ValueError, TypeError, OSError, EOFError, KeyError,
               IndexError, OverflowError, struct.error, zlib.error)


@dataclass
class Checkpoint:
    """Everything a run needs to continue: see `save_checkpoint` for the meaning of each field."""

    params: dict[str, np.ndarray]
    m: dict[str, np.ndarray] | None  # None: a file of weights alone (from-hf), or not read
    v: dict[str, np.ndarray] | None
    step: int
    config: Config
    vocab: str
    rng_state: dict
    train: dict = field(default_factory=dict)
    tokenizer_spec: str | None = None  # a BPE model's tokenizer.json text; None: characters
    # A LoRA run's (its settings in `train`): `params` is then the model, each adapter merged
    # into its weight, for every reader that runs the model; the trainer resumes from the
    # frozen base and the adapters, kept apart (m and v are the adapters' moments alone)
    base: dict[str, np.ndarray] | None = None
    adapters: Adapters | None = None

    def tokenizer(self):
        """The run's tokenizer: characters of `vocab`, or BPE from `tokenizer_spec`."""
        return tokenizer_of(self.vocab, self.tokenizer_spec)

    def rng(self) -> np.random.Generator:
        """A generator in exactly the saved state: it draws the same batches the run would have."""
        return generator_from_state(self.rng_state)


def generator_from_state(state: dict) -> np.random.Generator:
    """Rebuild a np.random.Generator from `rng.bit_generator.state`."""
    name = state.get("bit_generator") if isinstance(state, dict) else None
    if name not in _BIT_GENERATORS:
        raise ValueError(f"rng_state names an unknown bit generator {name!r}")
    bitgen = getattr(np.random, name)()
    try:
        bitgen.state = state
        same = bitgen.state == state  # a float or a missing field would be coerced silently
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError, IndexError) as e:
        raise ValueError(f"rng_state is not a valid {name} state ({type(e).__name__}: {e})") from e
    if not same:
        raise ValueError(f"rng_state is not a valid {name} state (it does not read back as "
                         "saved)")
    return np.random.Generator(bitgen)


def lora_of(train: dict) -> LoraSpec | None:
    """The LoRA adapters a run's settings `train` ask for (None: the whole model trains); the
    settings are read as `TrainConfig` reads them (ValueError/TypeError on a bad value)."""
    keys = ("lora_rank", "lora_alpha", "lora_targets")
    return TrainConfig().with_settings(**{k: train[k] for k in keys if k in train}).lora_spec()


def moment_shapes(config: Config, lora: LoraSpec | None) -> dict[str, tuple[int, ...]]:
    """The arrays the AdamW moments hold: the adapters' with LoRA, else every parameter's."""
    return adapter_shapes(config, lora) if lora else param_shapes(config)


def save_checkpoint(
    path: str | Path,
    params: dict[str, np.ndarray],
    m: dict[str, np.ndarray] | None,
    v: dict[str, np.ndarray] | None,
    step: int,
    rng: np.random.Generator,
    config: Config,
    vocab: str,
    train: dict | None = None,
    tokenizer_spec: str | None = None,
) -> None:
    """Write a checkpoint atomically.

    `step` is the number of updates already applied to `params` (and the 1-based count of the
    last one, for AdamW's bias correction); `rng` is the training generator, saved in the state
    in which it will draw the batch of update `step`; `train` holds the training settings;
    `tokenizer_spec` a BPE model's tokenizer.json text (then `vocab` is ""). `m` and `v` both
    None write the weights alone (a converted model: moments appear when training makes them).
    """
    moments = not (m is None and v is None)
    if moments and (m is None or v is None):
        raise ValueError("m and v must both be given, or both be None (weights alone)")
    lora = lora_of(train or {})  # LoRA: params holds the frozen base and the adapters, m and v
    trained = set(moment_shapes(config, lora)) if lora else set(params)  # the adapters' alone
    if m is not None and v is not None and (set(m) != trained or set(v) != trained
                                            or not trained <= set(params)):
        raise ValueError("m and v must have the adapters' keys, and params hold them (LoRA)"
                         if lora else "params, m and v must have the same keys")
    name = type(rng.bit_generator).__name__
    if name not in _BIT_GENERATORS:
        raise ValueError(f"rng uses the bit generator {name}, whose state is not plain JSON: "
                         f"use one of {_BIT_GENERATORS}, e.g. np.random.default_rng(seed)")
    arrays = {f"{group}/{k}": np.ascontiguousarray(a)
              for group, d in zip(GROUPS, (params, m, v), strict=True) if d is not None
              for k, a in d.items()}
    meta = {
        "format": FORMAT,
        "step": int(step),
        "config": config.to_dict(),
        "vocab": vocab,
        "rng_state": rng.bit_generator.state,
        "train": train or {},
        "checksums": {k: checksum(a) for k, a in arrays.items()},  # verified by load_checkpoint
    }
    if not moments:
        meta["moments"] = False  # a file of weights alone: its reader expects no m and v
    if tokenizer_spec is not None:
        meta["tokenizer"] = tokenizer_spec
    arrays["meta"] = np.array(json.dumps(meta))  # a 0-d unicode array: no pickle needed
    atomic_write(path, lambda f: np.savez(f, allow_pickle=False, **arrays))


def checksum(a: np.ndarray) -> str:
    """The CRC-32 of an array's bytes in C order, as 8 hex digits (what the metadata records)."""
    return f"{zlib.crc32(np.ascontiguousarray(a).data.cast('B')):08x}"


def config_mismatch(have: Config, want: Config) -> str:
    """The fields where two configs differ, as 'n_layer: 2 in the checkpoint, 4 asked'."""
    a, b = have.to_dict(), want.to_dict()
    return "; ".join(f"{k}: {a[k]} in the checkpoint, {b[k]} asked" for k in a if a[k] != b[k])


def _bad(path: Path, why: str) -> ValueError:
    return ValueError(f"checkpoint '{path}' {why}")


def _path(path: str | Path) -> Path:
    path = Path(path)
    if path.is_dir():
        path = path / "ckpt.npz"
    if not path.is_file():
        raise _bad(path, "does not exist: pass the ckpt.npz file that `xenith-edu train` wrote "
                         "(or its directory)")
    return path


def _read(path: Path, keep: tuple[str, ...]) -> tuple[dict[str, np.ndarray], list[str]]:
    """The arrays of the groups `keep` and the metadata, and the names of all the file holds."""
    try:
        return read_npz(path, lambda name: name == "meta" or name.split("/")[0] in keep)
    except _ZIP_ERRORS as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else one_line(e)
        raise _bad(path, f"is truncated or is not a xenith-edu checkpoint ({reason}): "
                         f"{_INTACT}") from None


def read_meta(path: str | Path) -> dict:
    """The checked metadata of a checkpoint (its config a `Config`), without reading an array:
    what the command line needs to know of a run before the trainer reads it once."""
    path = _path(path)
    arrays, _ = _read(path, ())
    if "meta" not in arrays:
        raise _bad(path, f"is truncated or is not a xenith-edu checkpoint (no metadata): {_AGAIN}")
    return _read_meta(path, arrays["meta"])


def load_checkpoint(path: str | Path, config: Config | None = None, *,
                    groups: tuple[str, ...] = GROUPS) -> Checkpoint:
    """Read and check a checkpoint; raise ValueError naming what is wrong with it.

    Checks: a complete .npz written by `save_checkpoint`, readable metadata (format, step >= 0,
    config, a vocabulary of vocab_size characters, a valid random state, the training settings),
    exactly the arrays the stored config implies with their shapes and one float dtype, finite
    parameters, and (if `config` is given) the same model config. `groups=("params",)` reads
    the weights alone (m and v are then None, as in a file of weights alone).
    """
    path = _path(path)
    if "params" not in groups or not set(groups) <= set(GROUPS):
        raise ValueError(f"groups must hold 'params' and only names of {GROUPS}, got {groups!r}")
    arrays, names = _read(path, tuple(groups))
    if "meta" not in arrays:
        raise _bad(path, f"is truncated or is not a xenith-edu checkpoint (no metadata): {_AGAIN}")
    meta = _read_meta(path, arrays.pop("meta"))
    stored, held = meta["config"], GROUPS if meta["moments"] else GROUPS[:1]
    base, lora = param_shapes(stored), meta["lora"]
    shapes = {"params": {**base, **moment_shapes(stored, lora)} if lora else base,
              "m": moment_shapes(stored, lora), "v": moment_shapes(stored, lora)}
    _check_arrays(path, arrays, names, shapes, held)
    _check_sums(path, arrays, names, meta.get("checksums"))
    if config is not None and config != stored:
        raise _bad(path, f"is from another model config ({config_mismatch(stored, config)}): "
                         "resume with the settings it was trained with, or start a new run")
    got = {g: {k: arrays[f"{g}/{k}"] for k in shapes[g]} for g in GROUPS
           if g in groups and g in held}  # "params" always: groups holds it, every file too
    params = got["params"]
    frozen: dict[str, np.ndarray] | None = None
    adapters: Adapters | None = None
    if lora is not None:  # the model for its readers, the parts kept
        frozen = {k: params[k] for k in base}
        adapters = Adapters(lora, {k: params[k] for k in shapes["m"]})
        params = merged(frozen, adapters)
    return Checkpoint(params, got.get("m"), got.get("v"), meta["step"], stored,
                      meta["vocab"], meta["rng_state"], meta["train"], meta.get("tokenizer"),
                      frozen, adapters)


def read_npz(path: Path, keep=lambda name: True) -> tuple[dict[str, np.ndarray], list[str]]:
    """The arrays of the .npz file `path` whose name `keep` accepts, and the names of all its
    arrays; each allocated only once the file is known to hold its bytes. Raises one of
    _ZIP_ERRORS (ValueError for what the zip reader accepts)."""
    limit, arrays, names = path.stat().st_size, {}, []
    with zipfile.ZipFile(path) as z:
        for info in z.infolist():
            name = info.filename.removesuffix(".npy")
            if name == info.filename or name in names:
                raise ValueError(f"member '{info.filename}' is not one array of the file")
            if info.compress_type != zipfile.ZIP_STORED or info.file_size > limit:
                raise ValueError(f"member '{info.filename}' claims {info.file_size} bytes, "
                                 "compressed or more than the file holds")
            names.append(name)
            if keep(name):
                with z.open(info) as f:
                    arrays[name] = _read_npy(f, info.file_size, info.filename)
    return arrays, names


def _read_npy(f, size: int, name: str) -> np.ndarray:
    """The array of .npy member `f` of `size` bytes: its header's claim checked before it is
    allocated, its bytes read to the end (which checks the zip CRC)."""
    version = np.lib.format.read_magic(f)
    if version not in ((1, 0), (2, 0)):
        raise ValueError(f"member '{name}' has .npy version {version}")
    read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0) else
                   np.lib.format.read_array_header_2_0)
    shape, fortran, dtype = read_header(f)
    if dtype.hasobject:
        raise ValueError(f"member '{name}' holds Python objects, which are never loaded")
    n_bytes = math.prod(shape) * dtype.itemsize
    if n_bytes != size - f.tell():
        raise ValueError(f"member '{name}' claims shape {shape} of {dtype}, {n_bytes} bytes, "
                         f"but holds {size - f.tell()}")
    buf = bytearray(n_bytes)  # at most the file's size: checked above
    view, at = memoryview(buf), 0
    while at < n_bytes:  # in pieces: the zip reader's own readinto would copy the whole member
        piece = f.read(min(_PIECE, n_bytes - at))
        if not piece:
            raise ValueError(f"member '{name}' is cut short")
        view[at:at + len(piece)] = piece
        at += len(piece)
    if f.read(1):
        raise ValueError(f"member '{name}' is cut short")
    return np.frombuffer(buf, dtype).reshape(shape, order="F" if fortran else "C")


def _read_meta(path: Path, raw: np.ndarray) -> dict:
    """The metadata record, each field checked: a ValueError names the first bad one."""
    try:
        text = str(raw[()])
        meta = parse_json(text.encode("utf-8", "surrogatepass"), "it",
                          max_bytes=2 * MAX_BYTES)  # a tokenizer.json, a vocabulary, settings
    except ValueError as e:  # the bounded reader's one line: too large, too deep, not JSON
        raise _bad(path, f"has unreadable metadata ({e}): {_AGAIN}") from None
    except (TypeError, IndexError) as e:
        raise _bad(path, f"has unreadable metadata ({type(e).__name__}: {e}): {_AGAIN}") from e
    if not isinstance(meta, dict):
        raise _bad(path, f"has unreadable metadata (a {type(meta).__name__}, not a record): "
                         f"{_AGAIN}")
    missing = [k for k in ("format", "step", "config", "vocab", "rng_state") if k not in meta]
    if missing:
        raise _bad(path, f"has metadata without {missing}: {_AGAIN}")
    if meta["format"] != FORMAT:
        raise _bad(path, f"has format {meta['format']!r}, this version reads {FORMAT!r}: train "
                         "again with this version")
    step = meta["step"]
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise _bad(path, f"has step {step!r}, not an integer >= 0: the file is damaged")
    try:
        stored = Config(**meta["config"])
    except (ValueError, TypeError) as e:
        raise _bad(path, f"has an unreadable config ({type(e).__name__}: {e}): {_AGAIN}") from e
    vocab = meta["vocab"]
    if not isinstance(vocab, str):
        raise _bad(path, f"has a vocab that is a {type(vocab).__name__}, not a str: {_AGAIN}")
    if "tokenizer" in meta:
        _check_bpe(path, meta["tokenizer"], vocab, stored)
    elif len(vocab) != stored.vocab_size:
        raise _bad(path, f"has a vocab of {len(vocab)} characters but a config with vocab_size "
                         f"{stored.vocab_size}: the file is damaged")
    else:
        try:
            CharTokenizer(vocab)
        except ValueError as e:
            raise _bad(path, f"has a damaged vocab ({e})") from e
    try:
        generator_from_state(meta["rng_state"])
    except ValueError as e:
        raise _bad(path, f"has a damaged rng_state ({e})") from e
    train = meta.get("train", {})
    if not isinstance(train, dict):
        raise _bad(path, f"has training settings 'train' that are a {type(train).__name__}, "
                         f"not a record: {_AGAIN}")
    moments = meta.get("moments", True)
    if not isinstance(moments, bool):
        raise _bad(path, f"has moments = {moments!r}, not true or false: the file is damaged")
    try:
        lora = lora_of(train)
        if lora is not None:
            adapter_shapes(stored, lora)  # a rank the model cannot hold, before any allocation
    except (ValueError, TypeError) as e:
        raise _bad(path, f"has damaged LoRA settings ({one_line(e)}): {_AGAIN}") from None
    return {**meta, "config": stored, "train": dict(train), "moments": moments, "lora": lora}


def _check_bpe(path: Path, spec: object, vocab: str, stored: Config) -> None:
    """A BPE model's tokenizer entry: a tokenizer.json text the library reads, no characters."""
    if not isinstance(spec, str) or vocab != "":
        raise _bad(path, f"has a damaged tokenizer entry (a {type(spec).__name__} with a vocab "
                         f"of {len(vocab)} characters): {_AGAIN}")
    try:
        size = tokenizer_of(vocab, spec).vocab_size
    except ValueError as e:
        raise _bad(path, f"has a tokenizer that cannot be used ({e})") from e
    if size > stored.vocab_size:
        raise _bad(path, f"has a tokenizer of {size} tokens but a config with vocab_size "
                         f"{stored.vocab_size}: the file is damaged")


def _check_arrays(path: Path, arrays: dict[str, np.ndarray], names: list[str],
                  shapes_of: dict[str, dict[str, tuple]], held: tuple[str, ...]) -> None:
    """The file holds exactly the arrays of `shapes_of[group]` in each group it `held`; those
    read have those shapes, one float dtype, and finite parameters."""
    expected = {f"{g}/{k}" for g in held for k in shapes_of[g]}
    held_names = set(names) - {"meta"}
    missing, extra = sorted(expected - held_names), sorted(held_names - expected)
    if missing:
        raise _bad(path, f"lacks arrays {missing[:4]} for its config: the file is damaged or "
                         "from another version")
    if extra:
        raise _bad(path, f"has unexpected arrays {extra[:4]} for its config: the file is "
                         "damaged or from another version")
    dtype = arrays["params/wte"].dtype
    for key, a, shape in ((f"{g}/{k}", arrays[f"{g}/{k}"], shape) for g in held
                          for k, shape in shapes_of[g].items() if f"{g}/{k}" in arrays):
        if a.shape != shape:
            raise _bad(path, f"has '{key}' of shape {a.shape}, but its config implies {shape}: "
                             "the file is damaged")
        if a.dtype != dtype or dtype.kind != "f":
            raise _bad(path, f"has '{key}' of dtype {a.dtype} and 'params/wte' of dtype "
                             f"{dtype}: all arrays must share one float dtype")
    bad = [k for k in shapes_of["params"] if not np.isfinite(arrays[f"params/{k}"]).all()]
    if bad:
        raise _bad(path, f"has non-finite parameters {bad[:4]}: use an earlier checkpoint")


def _check_sums(path: Path, arrays: dict[str, np.ndarray], names: list[str],
                sums: object) -> None:
    """Every array read matches the checksum its metadata records (a file older than the
    checksums records none, and is read as before)."""
    if sums is None:
        return
    if not isinstance(sums, dict) or set(sums) != set(names) - {"meta"}:
        raise _bad(path, f"has damaged checksums in its metadata: {_INTACT}")
    bad = sorted(k for k, a in arrays.items() if sums[k] != checksum(a))
    if bad:
        raise _bad(path, f"has arrays {bad[:4]} that do not match their checksums (flipped bits "
                         f"in the file): {_INTACT}")
