"""Checkpoints that lose nothing: parameters, AdamW moments, step, random state, config, vocab
(or, for a BPE model, its tokenizer.json).

One .npz file, written atomically (temporary file, then rename), read with allow_pickle=False
and checked on load, so that a resumed run continues bit for bit where the saved one stopped.
"""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..model import CharTokenizer, Config, param_shapes, tokenizer_of
from ..tools.util import atomic_write

FORMAT = "xenith-edu checkpoint 1"
GROUPS = ("params", "m", "v")  # parameters, AdamW first and second moments
_BIT_GENERATORS = ("PCG64", "PCG64DXSM")  # the generators whose state is plain JSON
_AGAIN = "use a checkpoint written by `xenith-edu train`"


@dataclass
class Checkpoint:
    """Everything a run needs to continue: see `save_checkpoint` for the meaning of each field."""

    params: dict[str, np.ndarray]
    m: dict[str, np.ndarray]
    v: dict[str, np.ndarray]
    step: int
    config: Config
    vocab: str
    rng_state: dict
    train: dict = field(default_factory=dict)
    tokenizer_spec: str | None = None  # a BPE model's tokenizer.json text; None: characters

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


def save_checkpoint(
    path: str | Path,
    params: dict[str, np.ndarray],
    m: dict[str, np.ndarray],
    v: dict[str, np.ndarray],
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
    `tokenizer_spec` a BPE model's tokenizer.json text (then `vocab` is "").
    """
    if set(params) != set(m) or set(params) != set(v):
        raise ValueError("params, m and v must have the same keys")
    name = type(rng.bit_generator).__name__
    if name not in _BIT_GENERATORS:
        raise ValueError(f"rng uses the bit generator {name}, whose state is not plain JSON: "
                         f"use one of {_BIT_GENERATORS}, e.g. np.random.default_rng(seed)")
    meta = {
        "format": FORMAT,
        "step": int(step),
        "config": config.to_dict(),
        "vocab": vocab,
        "rng_state": rng.bit_generator.state,
        "train": train or {},
    }
    if tokenizer_spec is not None:
        meta["tokenizer"] = tokenizer_spec
    arrays = {"meta": np.array(json.dumps(meta))}  # a 0-d unicode array: no pickle needed
    for group, d in zip(GROUPS, (params, m, v), strict=True):
        for k, a in d.items():
            arrays[f"{group}/{k}"] = a
    atomic_write(path, lambda f: np.savez(f, **arrays))


def config_mismatch(have: Config, want: Config) -> str:
    """The fields where two configs differ, as 'n_layer: 2 in the checkpoint, 4 asked'."""
    a, b = have.to_dict(), want.to_dict()
    return "; ".join(f"{k}: {a[k]} in the checkpoint, {b[k]} asked" for k in a if a[k] != b[k])


def _bad(path: Path, why: str) -> ValueError:
    return ValueError(f"checkpoint '{path}' {why}")


def load_checkpoint(path: str | Path, config: Config | None = None) -> Checkpoint:
    """Read and check a checkpoint; raise ValueError naming what is wrong with it.

    Checks: a complete .npz written by `save_checkpoint`, readable metadata (format, step >= 0,
    config, a vocabulary of vocab_size characters, a valid random state, the training settings),
    exactly the arrays the stored config implies with their shapes and one float dtype, finite
    parameters, and (if `config` is given) the same model config.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "ckpt.npz"
    if not path.is_file():
        raise _bad(path, "does not exist: pass the ckpt.npz file that `xenith-edu train` wrote "
                         "(or its directory)")
    unreadable = "is truncated or is not a xenith-edu checkpoint"
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}  # reading every member checks its CRC
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, KeyError) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise _bad(path, f"{unreadable} ({reason}): use an intact checkpoint or train "
                         "again") from e
    if "meta" not in arrays:
        raise _bad(path, f"{unreadable} (no metadata): {_AGAIN}")
    meta = _read_meta(path, arrays.pop("meta"))
    stored = meta["config"]
    _check_arrays(path, arrays, param_shapes(stored))
    if config is not None and config != stored:
        raise _bad(path, f"is from another model config ({config_mismatch(stored, config)}): "
                         "resume with the settings it was trained with, or start a new run")
    groups = {g: {k: arrays[f"{g}/{k}"] for k in param_shapes(stored)} for g in GROUPS}
    return Checkpoint(groups["params"], groups["m"], groups["v"], meta["step"], stored,
                      meta["vocab"], meta["rng_state"], meta["train"], meta.get("tokenizer"))


def _read_meta(path: Path, raw: np.ndarray) -> dict:
    """The metadata record, each field checked: a ValueError names the first bad one."""
    try:
        meta = json.loads(str(raw[()]))
    except (ValueError, TypeError, IndexError) as e:
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
    return {**meta, "config": stored, "train": dict(train)}


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


def _check_arrays(path: Path, arrays: dict[str, np.ndarray], shapes: dict[str, tuple]) -> None:
    """Exactly the arrays of `shapes` in every group, with those shapes, one float dtype, and
    finite parameters."""
    expected = {f"{g}/{k}" for g in GROUPS for k in shapes}
    missing, extra = sorted(expected - set(arrays)), sorted(set(arrays) - expected)
    if missing:
        raise _bad(path, f"lacks arrays {missing[:4]} for its config: the file is damaged or "
                         "from another version")
    if extra:
        raise _bad(path, f"has unexpected arrays {extra[:4]} for its config: the file is "
                         "damaged or from another version")
    dtype = arrays["params/wte"].dtype
    for key, a, shape in ((f"{g}/{k}", arrays[f"{g}/{k}"], shape) for g in GROUPS
                          for k, shape in shapes.items()):
        if a.shape != shape:
            raise _bad(path, f"has '{key}' of shape {a.shape}, but its config implies {shape}: "
                             "the file is damaged")
        if a.dtype != dtype or dtype.kind != "f":
            raise _bad(path, f"has '{key}' of dtype {a.dtype} and 'params/wte' of dtype "
                             f"{dtype}: all arrays must share one float dtype")
    bad = [k for k in shapes if not np.isfinite(arrays[f"params/{k}"]).all()]
    if bad:
        raise _bad(path, f"has non-finite parameters {bad[:4]}: use an earlier checkpoint")
