"""The model's boundary: the only place where the parameters and the tokens are checked.
`forward`, `backward`, `loss_and_grads` and generation call these; the components trust theirs.
"""

from __future__ import annotations

import numpy as np

from .config import Config
from .params import param_shapes


def check_params(params: dict, cfg: Config) -> np.dtype:
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict of arrays, got {type(params).__name__}")
    shapes = param_shapes(cfg)
    missing = [k for k in shapes if k not in params]
    if missing:
        raise ValueError(f"params is missing keys {missing} for this config")
    extra = [k for k in params if k not in shapes]
    if extra:
        raise ValueError(f"params has keys {extra} that this config does not use")
    dtype = getattr(params["wte"], "dtype", None)
    for k, shape in shapes.items():
        p = params[k]
        if not isinstance(p, np.ndarray):
            raise TypeError(f"params['{k}'] must be a NumPy array, got {type(p).__name__}")
        if p.shape != shape:
            raise ValueError(f"params['{k}'] has shape {p.shape}, the config expects {shape}")
        if p.dtype != dtype or dtype not in (np.float32, np.float64):
            raise TypeError(f"params['{k}'] has dtype {p.dtype}; all must share one dtype, "
                            "float32 or float64")
    return np.dtype(dtype)  # not None: every parameter has it


def check_tokens(name: str, t: object, cfg: Config) -> np.ndarray:
    if not isinstance(t, np.ndarray):
        raise TypeError(f"{name} must be a NumPy integer array of shape (B, S)")
    if t.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integer token ids, got dtype {t.dtype}")
    if t.ndim != 2 or t.shape[0] < 1 or t.shape[1] < 1:
        raise ValueError(f"{name} must have shape (B, S) with B, S >= 1, got {t.shape}")
    if t.shape[1] > cfg.seq_len:
        raise ValueError(
            f"{name} has {t.shape[1]} positions, longer than Config.seq_len = {cfg.seq_len}"
        )
    lo, hi = int(t.min()), int(t.max())
    if lo < 0 or hi >= cfg.vocab_size:
        raise ValueError(f"{name} has token ids in [{lo}, {hi}], outside [0, {cfg.vocab_size})")
    return t


def check_targets(y: object, x: np.ndarray, cfg: Config) -> np.ndarray:
    if isinstance(y, np.ndarray) and y.shape != x.shape:
        raise ValueError(f"y has shape {y.shape}, but the inputs x have shape {x.shape}")
    return check_tokens("y", y, cfg)


# -- heads: the stream's rows regrouped by sequence, head and position ----------------------
