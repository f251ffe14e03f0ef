"""Exercises of the training chapter: AdamW, the learning-rate schedule, and relatives.

See the "Training the model" chapter; each check diagnoses the usual mistakes.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ..training.optim import adamw_update, lr_at
from .engine import check
from .kit import amax, int_sampler, log_uniform, randn
from .types import Case, CheckResult, Mistake, Spec

# Shape legend: p, g, m, v all have the shape of one parameter (any shape); AdamW is elementwise.


def _adamw_reference(p, g, m, v, t, lr, beta1, beta2, eps, weight_decay) -> tuple:
    return adamw_update(p, g, m, v, t, lr, beta1, beta2, eps, weight_decay)


def hyper(rng: np.random.Generator, wd: tuple[float, float]) -> tuple:
    """(lr, beta1, beta2, eps, weight_decay), each drawn from its usual range."""
    return (log_uniform(rng, 1e-4, 3e-2), float(rng.uniform(0.8, 0.95)),
            float(rng.uniform(0.9, 0.999)), log_uniform(rng, 1e-8, 1e-5),
            float(rng.uniform(*wd)) if wd[1] > 0 else 0.0)


def _adamw_cases(rng: np.random.Generator, zero_decay: tuple = (0.0, 0.0)) -> list[Case]:
    ints = int_sampler(rng)

    n, a, k = ints(3, 6), ints(4, 6), ints(9, 11)
    plans = [  # what, shape, dtype, t, weight decay range, gradient scale
        ("gradients near eps, ", (a, 3), np.float64, ints(2, 5), (0.05, 0.2), "eps"),
        ("", (n,), np.float32, ints(5, 10), (0.05, 0.2), 1.0),
        ("", (2, 3, 4), np.float64, 1, (0.01, 0.1), 1.0),
        ("zero gradient, ", (n + 1,), np.float64, ints(500, 1000), zero_decay, 0.0),
        ("large gradients, a square p, ", (k, k), np.float64, ints(2, 20), (0.05, 0.2), 300.0),
    ]
    cases = []
    for what, shape, dtype, t, wd, gscale in plans:
        lr, b1, b2, eps, decay = hyper(rng, wd)
        scale = 10 * eps if gscale == "eps" else float(gscale)
        p = randn(rng, shape, dtype, 100 * scale if gscale == "eps" else 1.0)  # L2: wd p ~ g
        g = randn(rng, shape, dtype, 0.1 * scale)
        m = randn(rng, shape, dtype, 0.05 * (scale or 1)) if t > 1 else np.zeros(shape, dtype)
        v = (randn(rng, shape, dtype, 0.03 * (scale or 1)) ** 2).astype(dtype) if t > 1 else \
            np.zeros(shape, dtype)
        first = " (first update)" if t == 1 else ""
        label = (f"{np.dtype(dtype).name}, {what}p {shape}, t={t}{first}, lr={lr:.3g}, "
                 f"beta1={b1:.3f}, beta2={b2:.4f}, eps={eps:.1e}, weight_decay={decay:.3g}")
        cases.append(Case(label, (p, g, m, v, t, lr, b1, b2, eps, decay)))
    return cases


def adam_step(p, g, m, v, t, lr, b1, b2, eps, decay, *, sign=-1.0, eps_in=False, sq=True,
              t_bias=None) -> dict:
    """One Adam step in float64 on (m, v) from gradient g, from the decayed parameter `decay`."""
    t_bias = t if t_bias is None else t_bias
    m2 = b1 * m + (1 - b1) * g
    v2 = b2 * v + (1 - b2) * (g * g if sq else g)
    mh = m2 / (1 - b1**t_bias) if t_bias else m2
    vh = v2 / (1 - b2**t_bias) if t_bias else v2
    den = np.sqrt(vh + eps) if eps_in else np.sqrt(vh) + eps
    return {"p": decay + sign * lr * mh / den, "m": m2, "v": v2}


_FIXED = {  # hyperparameters typed in instead of read: the usual defaults
    "lr": (1e-3, 3e-4, 6e-4), "beta1": (0.9,), "beta2": (0.95, 0.999), "eps": (1e-8,),
    "weight_decay": (0.1, 0.01),
}


def _adamw_mistakes(args: tuple, exp: dict) -> list[Mistake]:
    p, g, m, v, t, lr, b1, b2, eps, wd = args

    def step(g=g, decay=p * (1 - lr * wd), **kw) -> dict:
        return adam_step(p, g, m, v, t, lr, b1, b2, eps, decay, **kw)

    table = [
        ("the bias correction is missing: m_hat = m / (1 - beta1**t), v_hat = v / "
         "(1 - beta2**t).", lambda: {"p": step(t_bias=0)["p"]}),
        ("the bias correction uses t + 1: t is already the 1-based update count.",
         lambda: {"p": step(t_bias=t + 1)["p"]}),
        ("the weight decay goes through the gradient (L2, as in Adam): AdamW decouples it, "
         "p * (1 - lr * weight_decay), and the moments see only g.",
         lambda: step(g=g + wd * p, decay=p)),
        ("the weight decay is missing: p * (1 - lr * weight_decay).",
         lambda: {"p": step(decay=p)["p"]}),
        ("the weight decay is not scaled by lr: p * (1 - lr * weight_decay).",
         lambda: {"p": step(decay=p * (1 - wd))["p"]}),
        ("the step goes uphill: p moves by -lr * m_hat / (sqrt(v_hat) + eps).",
         lambda: {"p": step(sign=1.0)["p"]}),
        ("eps is inside the square root: it goes outside, sqrt(v_hat) + eps.",
         lambda: {"p": step(eps_in=True)["p"]}),
        ("v must average g**2, not g.", lambda: {"v": step(sq=False)["v"]}),
    ]
    return table + fixed_mistakes(args, lambda hp: adam_step(p, g, m, v, t, *hp[:4],
                                                             decay=p * (1 - hp[0] * hp[4])))


def fixed_mistakes(args: tuple, step: Callable[[tuple], dict]) -> list[Mistake]:
    """A hyperparameter typed in instead of read: `step(hyperparameters)` is the answer then."""
    hp0 = list(args[5:10])  # lr, beta1, beta2, eps, weight_decay
    table = []
    for k, name in enumerate(("lr", "beta1", "beta2", "eps", "weight_decay")):
        for fixed in _FIXED[name]:
            if hp0[k] == fixed:
                continue
            hp = tuple(hp0[:k] + [fixed] + hp0[k + 1:])
            table.append((f"{name} is fixed at {fixed:g} instead of read from the argument "
                          f"{name}.", lambda hp=hp: step(hp)))
    return table


ADAMW = Spec(
    id="adamw_update",
    reference_name="xenith_edu.optim.adamw_update",
    arg_names=("p", "g", "m", "v", "t", "lr", "beta1", "beta2", "eps", "weight_decay"),
    out_names=("p", "m", "v"),
    kinds=("array",) * 3,
    reference=_adamw_reference,
    cases=_adamw_cases,
    seed=808,
    summary="float64 and float32, t = 1 to 1000, with and without weight decay, gradients up "
            "to ~1e2, a square p",
    mistakes=_adamw_mistakes,
    floor=lambda a: {"p": amax(a[0]) + a[5], "m": amax(a[2]) + amax(a[1]),
                     "v": amax(a[3]) + amax(a[1]) ** 2},
)


def check_adamw_update(fn: Callable) -> CheckResult:
    """`fn(p, g, m, v, t, lr, beta1, beta2, eps, weight_decay) -> (p, m, v)`.

    See the "Training the model" chapter.
    """
    return check(ADAMW, fn)


def adam_l2_reference(p, g, m, v, t, lr, beta1, beta2, eps, weight_decay) -> tuple:
    """Adam with L2 regularisation: the decay goes into the gradient, so through the moments."""
    args = [np.asarray(a, dtype=np.float64) for a in (p, g, m, v)]
    out = adam_step(args[0], args[1] + weight_decay * args[0], *args[2:], t, lr, beta1, beta2,
                    eps, decay=args[0])
    return tuple(out[n].astype(p.dtype) for n in ("p", "m", "v"))


def _adam_l2_mistakes(args: tuple, exp: dict) -> list[Mistake]:
    p, g, m, v, t, lr, b1, b2, eps, wd = args
    adamw = dict(zip(("p", "m", "v"), _adamw_reference(*args), strict=True))
    gl2 = g + wd * p
    return [
        ("that is AdamW's decoupled decay: Adam with L2 adds weight_decay * p to the gradient, "
         "so the decay goes through the moments and is divided by sqrt(v_hat) + eps.",
         lambda: adamw),
        ("the L2 term is in the step but not in the moments: m and v must average g + "
         "weight_decay * p.", lambda: {"m": b1 * m + (1 - b1) * g, "v": b2 * v + (1 - b2) * g * g}),
        ("the L2 term is added twice: once to the gradient and once as a decoupled decay.",
         lambda: {"p": adam_step(p, gl2, m, v, t, lr, b1, b2, eps, p * (1 - lr * wd))["p"]}),
        ("the L2 gradient of (weight_decay / 2) * p**2 is weight_decay * p, not "
         "weight_decay * p / 2.",
         lambda: adam_step(p, g + wd * p / 2, m, v, t, lr, b1, b2, eps, p)),
        ("the bias correction is missing: m_hat = m / (1 - beta1**t), v_hat = v / "
         "(1 - beta2**t).", lambda: {"p": adam_step(p, gl2, m, v, t, lr, b1, b2, eps, p,
                                                    t_bias=0)["p"]}),
    ] + fixed_mistakes(args, lambda hp: dict(zip(("p", "m", "v"), adam_l2_reference(
        p, g, m, v, t, *hp), strict=True)))


ADAM_L2 = Spec(
    id="adam_l2_update",
    reference_name="Adam with L2 regularisation",
    arg_names=("p", "g", "m", "v", "t", "lr", "beta1", "beta2", "eps", "weight_decay"),
    out_names=("p", "m", "v"),
    kinds=("array",) * 3,
    reference=adam_l2_reference,
    cases=lambda rng: _adamw_cases(rng, zero_decay=(0.05, 0.2)),
    seed=810,
    summary="float64 and float32, t = 1 to 1000, a zero gradient where only the decay acts, "
            "gradients up to ~1e2, a square p",
    mistakes=_adam_l2_mistakes,
    floor=lambda a: {"p": amax(a[0]) + a[5], "m": amax(a[2]) + amax(a[1]) + amax(a[0]),
                     "v": amax(a[3]) + (amax(a[1]) + amax(a[0])) ** 2},
)


def check_adam_l2_update(fn: Callable) -> CheckResult:
    """`fn(p, g, m, v, t, lr, beta1, beta2, eps, weight_decay) -> (p, m, v)`: Adam with L2.

    The loss gains (weight_decay / 2) * sum(p**2); compare with AdamW's decoupled decay.
    See the "Training the model" chapter.
    """
    return check(ADAM_L2, fn)


def _lr_reference(step, max_lr, min_lr, warmup_steps, decay_steps) -> tuple:
    return (lr_at(step, max_lr, min_lr, warmup_steps, decay_steps),)


def _lr_cases(rng: np.random.Generator) -> list[Case]:
    cases = []
    max1 = log_uniform(rng, 1e-4, 3e-3)
    schedules = [(max1, max1 * float(rng.uniform(0.05, 0.2)), int(rng.integers(6, 16)),
                  int(rng.integers(60, 200))),
                 (log_uniform(rng, 1e-4, 3e-3), 0.0, int(rng.integers(3, 5)),
                  int(rng.integers(15, 30)))]
    for max_lr, min_lr, warmup, decay in schedules:
        for step in sorted({0, 1, warmup // 2, warmup - 1, warmup, warmup + 1,
                            (warmup + decay) // 2, decay - 1, decay, decay + 7}):
            phase = ("warmup" if step < warmup else "cosine decay" if step < decay
                     else "after the decay")
            cases.append(Case(f"step={step} ({phase}), max_lr={max_lr:.4g}, "
                              f"min_lr={min_lr:.4g}, warmup_steps={warmup}, "
                              f"decay_steps={decay}", (step, max_lr, min_lr, warmup, decay)))
    return cases


def _lr_mistakes(args: tuple, exp: dict) -> list[Mistake]:
    step, max_lr, min_lr, warmup, decay = args
    progress = (step - warmup) / (decay - warmup)
    in_decay = warmup <= step < decay
    return [
        ("the warmup is off by one: update 0 already moves, lr = max_lr * (step + 1) / "
         "warmup_steps.", lambda: {"lr": max_lr * step / warmup} if step < warmup else {}),
        ("the decay is linear: it follows a half cosine, min_lr + 0.5 * (1 + cos(pi * "
         "progress)) * (max_lr - min_lr).",
         lambda: {"lr": max_lr - progress * (max_lr - min_lr)} if in_decay else {}),
        ("the cosine decays to 0: it ends at min_lr.",
         lambda: {"lr": 0.5 * (1 + math.cos(math.pi * progress)) * max_lr}
         if in_decay and min_lr else {}),
        ("the decay's progress counts from step 0: it starts after the warmup, progress = "
         "(step - warmup_steps) / (decay_steps - warmup_steps).",
         lambda: {"lr": min_lr + 0.5 * (1 + math.cos(math.pi * step / decay)) *
                  (max_lr - min_lr)} if in_decay else {}),
        ("after decay_steps the rate stays at min_lr.",
         lambda: {"lr": 0.0} if step >= decay and min_lr else {}),
    ]


LR = Spec(
    id="lr_schedule",
    reference_name="xenith_edu.optim.lr_at",
    arg_names=("step", "max_lr", "min_lr", "warmup_steps", "decay_steps"),
    out_names=("lr",),
    kinds=("float",),
    reference=_lr_reference,
    cases=_lr_cases,
    seed=809,
    summary="two schedules, steps in the warmup, the cosine decay and after it",
    single=True,
    mistakes=_lr_mistakes,
    floor=lambda a: {"lr": a[1]},
    tol=1e-9,
)


def check_lr_schedule(fn: Callable) -> CheckResult:
    """`fn(step, max_lr, min_lr, warmup_steps, decay_steps) -> float`.

    See the "Training the model" chapter.
    """
    return check(LR, fn)


SPECS = [ADAMW, LR, ADAM_L2]

__all__ = ["check_adamw_update", "check_lr_schedule", "check_adam_l2_update"]
