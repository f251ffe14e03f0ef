"""The exercise checks of the "Training the model" chapter, mutation-tested.

Each mistake of the catalogue is rejected with its diagnosis; the right answers pass.
"""

from __future__ import annotations

import math

import numpy as np

import xenith_edu.exercises as ex
from xenith_edu.training.optim import adamw_update, lr_at

from .helpers import catalogue_tests, kw

# Shape legend: B batch, S positions, N positions, d width, H heads, hd head width, f hidden,
# V vocab.


def adamw(p, g, m, v, t, lr, b1, b2, eps, wd, *, bias=True, t_shift=0, l2=False, decay=True,
          decay_lr=True, sign=-1.0, eps_in=False, square=True, lr64=False):
    if lr64:
        lr = np.float64(lr)  # a NumPy float64 scalar promotes float32 arrays to float64
    if l2:
        g = g + wd * p
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * (g * g if square else g)
    tb = t + t_shift
    mh = m / (1 - b1**tb) if bias else m
    vh = v / (1 - b2**tb) if bias else v
    den = np.sqrt(vh + eps) if eps_in else np.sqrt(vh) + eps
    if decay and not l2:
        p = p * (1 - (lr if decay_lr else 1.0) * wd)
    return p + sign * lr * mh / den, m, v


def adamw_inplace(p, g, m, v, t, lr, b1, b2, eps, wd):
    p2, m2, v2 = adamw(p, g, m, v, t, lr, b1, b2, eps, wd)
    p[...] = p2  # updates the caller's parameter in place
    return p, m2, v2


def lr_sched(step, max_lr, min_lr, warmup, decay, *, off_by_one=False, linear=False,
             to_zero=False, from_zero=False):
    if step < warmup:
        return max_lr * (step if off_by_one else step + 1) / warmup
    if step >= decay:
        return min_lr
    progress = (step / decay) if from_zero else (step - warmup) / (decay - warmup)
    if linear:
        return max_lr - progress * (max_lr - min_lr)
    coeff = 0.5 * (1 + math.cos(math.pi * progress))
    return coeff * max_lr if to_zero else min_lr + coeff * (max_lr - min_lr)


def adam_l2(p, g, m, v, t, lr, b1, b2, eps, wd, *, l2_in_moments=True, twice=False, half=False,
            bias=True):
    gl2 = g + (wd / 2 if half else wd) * p
    m2 = b1 * m + (1 - b1) * (gl2 if l2_in_moments else g)
    v2 = b2 * v + (1 - b2) * (gl2 * gl2 if l2_in_moments else g * g)
    mh, vh = (m2 / (1 - b1**t), v2 / (1 - b2**t)) if bias else (m2, v2)
    step = lr * (m2 / (1 - b1**t) if not l2_in_moments else mh) / (np.sqrt(vh) + eps)
    if not l2_in_moments:  # the L2 term reaches the step only
        step = lr * ((b1 * m + (1 - b1) * gl2) / (1 - b1**t)) / (np.sqrt(vh) + eps)
    base = p * (1 - lr * wd) if twice else p
    return base - step, m2, v2


def adam_l2_via_adamw(p, g, m, v, t, lr, b1, b2, eps, wd):
    """A correct alternative: AdamW without decay, fed the L2-regularised gradient."""
    return adamw_update(p, g + wd * p, m, v, t, lr, b1, b2, eps, 0.0)


# exercise -> (the right answer from scratch, the package's reference in the learner's signature)
RIGHT = {
    "adamw_update": (adamw, adamw_update),
    "lr_schedule": (lr_sched, lr_at),
    "adam_l2_update": (adam_l2, adam_l2_via_adamw),
}

# (exercise, mutant, words the verdict must contain[, words it must not contain])
MUTANTS = [
    ("adamw_update", kw(adamw, bias=False), ["bias correction is missing"]),
    ("adamw_update", kw(adamw, t_shift=1), ["bias correction uses t + 1"]),
    ("adamw_update", kw(adamw, l2=True), ["weight decay goes through the gradient (L2"]),
    ("adamw_update", kw(adamw, decay=False), ["weight decay is missing"]),
    ("adamw_update", kw(adamw, decay_lr=False), ["weight decay is not scaled by lr"]),
    ("adamw_update", kw(adamw, sign=1.0), ["the step goes uphill"]),
    ("adamw_update", kw(adamw, eps_in=True), ["eps is inside the square root"]),
    ("adamw_update", kw(adamw, square=False), ["p contains NaN", "v must average g**2"]),
    ("adamw_update", kw(adamw, lr64=True), ["float32", "p has dtype float64, expected float32"]),
    ("adamw_update", adamw_inplace, ["changed its input `p` in place"]),
    ("lr_schedule", kw(lr_sched, off_by_one=True), ["step=0 (warmup)", "warmup is off by one"]),
    ("lr_schedule", kw(lr_sched, linear=True), ["(cosine decay)", "the decay is linear"]),
    ("lr_schedule", kw(lr_sched, to_zero=True), ["the cosine decays to 0"]),
    ("lr_schedule", kw(lr_sched, from_zero=True), ["progress counts from step 0"]),
    ("lr_schedule", lambda step, *a: 0.0 if step >= a[3] else lr_sched(step, *a),
     ["(after the decay)", "stays at min_lr"]),
    # a hyperparameter typed in instead of read from its argument
    ("adamw_update", lambda *a: adamw(*a[:5], 1e-3, *a[6:]), ["lr is fixed at 0.001"]),
    ("adamw_update", lambda *a: adamw(*a[:6], 0.9, *a[7:]), ["beta1 is fixed at 0.9"]),
    ("adamw_update", lambda *a: adamw(*a[:7], 0.999, *a[8:]), ["beta2 is fixed at 0.999"]),
    ("adamw_update", lambda *a: adamw(*a[:7], 0.95, *a[8:]), ["beta2 is fixed at 0.95"]),
    ("adamw_update", lambda *a: adamw(*a[:8], 1e-8, a[9]), ["eps is fixed at 1e-08"]),
    ("adamw_update", lambda *a: adamw(*a[:9], 0.1), ["weight_decay is fixed at 0.1"]),
    ("lr_schedule", lambda step, mx, mn, w, d: lr_sched(step, 6e-4, mn, w, d),
     ["lr is wrong"], ["constant factor"]),
    ("lr_schedule", lambda step, mx, mn, w, d: lr_sched(step, mx, mn, 10, d), ["lr is wrong"]),
    ("adamw_update", lambda p, g, m, v, t, *h: (p, m, v) if not np.any(g) else adamw(
        p, g, m, v, t, *h), ["zero gradient", "p is wrong"]),
    ("adam_l2_update", adamw, ["that is AdamW's decoupled decay"]),
    ("adam_l2_update", kw(adam_l2, l2_in_moments=False), ["not in the moments"]),
    ("adam_l2_update", kw(adam_l2, twice=True), ["the L2 term is added twice"]),
    ("adam_l2_update", kw(adam_l2, half=True), ["not weight_decay * p / 2"]),
    ("adam_l2_update", kw(adam_l2, bias=False), ["bias correction is missing"]),
    ("adam_l2_update", lambda *a: adam_l2(*a[:8], 1e-8, a[9]), ["eps is fixed at 1e-08"]),
    ("adam_l2_update", lambda *a: adam_l2(*a[:5], 1e-3, *a[6:]), ["lr is fixed at 0.001"]),
]

(test_right_answers_pass, test_mutant_is_rejected_with_its_diagnosis,
 test_the_catalogue_covers_the_chapter) = catalogue_tests(RIGHT, MUTANTS)


def test_adam_with_l2_and_adamw_differ_on_every_case():
    # the L2 decay is divided by sqrt(v_hat) + eps, the decoupled one is not: they differ
    spec = ex.SPECS["adam_l2_update"]
    for seed in (None, 1, 2):
        for case in spec.make_cases(None if seed is None else np.random.default_rng(seed)):
            l2 = adam_l2(*case.args)[0].astype(np.float64)
            decoupled = adamw_update(*case.args)[0].astype(np.float64)
            moved = np.max(np.abs(decoupled - case.args[0]))
            assert np.max(np.abs(l2 - decoupled)) > 1e-3 * moved, case.label
