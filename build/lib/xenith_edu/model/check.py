"""The whole-model gradient check: sampled coordinates of every parameter against central
finite differences in float64 (see the whole backward pass chapter).
"""

from __future__ import annotations

import numpy as np

from ..softmax_ce import softmax_cross_entropy
from ..tools.gradcheck import GradCheck, H, check_gradient
from .config import Config
from .params import param_shapes
from .transformer import forward, loss_and_grads


def check_model(
    params: dict,
    cfg: Config,
    x: np.ndarray,
    y: np.ndarray,
    n_coords: int = 8,
    seed: int = 0,
    h: float = H,
    tol: float = 1e-6,
) -> list[GradCheck]:
    """The whole-model check: `n_coords` sampled coordinates of every parameter.

    `params` must be float64. Returns one GradCheck per parameter, in the contract's order.
    See the whole backward pass chapter.
    """
    if any(p.dtype != np.float64 for p in params.values()):
        raise TypeError("check_model needs float64 params: cast them with .astype(np.float64)")
    rng = np.random.default_rng(seed)
    _, grads = loss_and_grads(params, cfg, x, y)
    results = []
    for name in param_shapes(cfg):
        def f(p, name=name):  # the loss alone: a forward pass
            logits = forward({**params, name: p}, cfg, x)[0]
            return softmax_cross_entropy(logits, y, cfg.pad_token_id)[0]

        results.append(check_gradient(f, params[name], grads[name], name=name, h=h, tol=tol,
                                      n_coords=n_coords, rng=rng))
    return results
