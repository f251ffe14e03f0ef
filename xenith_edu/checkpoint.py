"""Checkpoints that lose nothing: parameters, AdamW moments, step, random state, config, vocab.

One .npz file, written atomically (temporary file, then rename), read with allow_pickle=False
and checked on load, so that a resumed run continues bit for bit where the saved one stopped.
"""

from __future__ import annotations

import json
import os
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import numpy as np

from .model import Config, param_shapes

FORMAT = "xenith-edu checkpoint 1"
GROUPS = ("params", "m", "v")  # parameters, AdamW first and second moments
_UMASK = os.umask(0o022)  # read the process umask (the only way is to set it) ...
os.umask(_UMASK)  # ... and put it back at once
_BIT_GENERATORS = ("PCG64", "PCG64DXSM", "Philox", "SFC64", "MT19937")


def atomic_write(path: str | Path, write: Callable[[IO[bytes]], None]) -> None:
    """Call write(f) on a temporary file next to `path`, then rename it onto `path`.

    A crash or an error mid-write leaves any previous file at `path` untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; give the usual permissions
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


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

    def rng(self) -> np.random.Generator:
        """A generator in exactly the saved state: it draws the same batches the run would have."""
        return generator_from_state(self.rng_state)


def generator_from_state(state: dict) -> np.random.Generator:
    """Rebuild a np.random.Generator from `rng.bit_generator.state`."""
    name = state.get("bit_generator") if isinstance(state, dict) else None
    if name not in _BIT_GENERATORS:
        raise ValueError(f"rng_state names an unknown bit generator {name!r}")
    bitgen = getattr(np.random, name)()
    bitgen.state = state
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
) -> None:
    """Write a checkpoint atomically.

    `step` is the number of updates already applied to `params` (and the 1-based count of the
    last one, for AdamW's bias correction); `rng` is the training generator, saved in the state
    in which it will draw the batch of update `step`; `train` holds the training settings.
    """
    if set(params) != set(m) or set(params) != set(v):
        raise ValueError("params, m and v must have the same keys")
    meta = {
        "format": FORMAT,
        "step": int(step),
        "config": config.to_dict(),
        "vocab": vocab,
        "rng_state": rng.bit_generator.state,
        "train": train or {},
    }
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
    """Read and check a checkpoint; raise ValueError saying what is wrong with it.

    Checks: a complete .npz written by `save_checkpoint`, every key present with the shape the
    stored config implies, finite parameters, and (if `config` is given) the same model config.
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
    if not isinstance(arrays, dict) or "meta" not in arrays:
        raise _bad(path, f"{unreadable} (no metadata): use a checkpoint written by "
                         "`xenith-edu train`")
    try:
        meta = json.loads(str(arrays.pop("meta")[()]))
        fmt = meta.get("format")
        step, vocab, rng_state = int(meta["step"]), meta["vocab"], meta["rng_state"]
        stored = Config(**meta["config"])
        train = dict(meta.get("train", {}))
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as e:
        raise _bad(path, f"has unreadable metadata ({type(e).__name__}: {e}): use a "
                         "checkpoint written by `xenith-edu train`") from e
    if fmt != FORMAT:
        raise _bad(path, f"has format {fmt!r}, this version reads {FORMAT!r}: train again "
                         "with this version")
    if step < 0:
        raise _bad(path, f"has a negative step {step}: the file is damaged")
    if not isinstance(vocab, str) or len(vocab) != stored.vocab_size:
        raise _bad(path, f"has a vocabulary of {len(vocab)} characters but a config with "
                         f"vocab_size {stored.vocab_size}: the file is damaged")
    try:
        generator_from_state(rng_state)
    except (ValueError, TypeError, KeyError) as e:
        raise _bad(path, f"has a damaged random-generator state ({e})") from e

    shapes = param_shapes(stored)
    expected = {f"{g}/{k}" for g in GROUPS for k in shapes}
    missing, extra = sorted(expected - set(arrays)), sorted(set(arrays) - expected)
    if missing or extra:
        what = f"lacks {missing[:4]}" if missing else f"has unexpected arrays {extra[:4]}"
        raise _bad(path, f"{what} for its config: the file is damaged or from another version")
    dtype = arrays["params/wte"].dtype
    for key, a in arrays.items():
        shape = shapes[key.split("/", 1)[1]]
        if a.shape != shape:
            raise _bad(path, f"has '{key}' of shape {a.shape}, but its config implies {shape}: "
                             "the file is damaged")
        if a.dtype != dtype or dtype.kind != "f":
            raise _bad(path, f"has '{key}' of dtype {a.dtype}; all arrays must share one float "
                             "dtype")
    if not all(np.isfinite(arrays[f"params/{k}"]).all() for k in shapes):
        raise _bad(path, "has non-finite parameters: use an earlier checkpoint")

    if config is not None and config != stored:
        raise _bad(path, f"is from another model config ({config_mismatch(stored, config)}): "
                         "resume with the settings it was trained with, or start a new run")
    groups = {g: {k: arrays[f"{g}/{k}"] for k in shapes} for g in GROUPS}
    return Checkpoint(groups["params"], groups["m"], groups["v"], step, stored, vocab,
                      rng_state, train)
