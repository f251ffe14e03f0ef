"""LoRA adapters on the model's projections: which layers get one, their shapes, and the one
gate their arrays pass. The component (forward, backward, init) is `xenith_edu.lora`.

With adapters the base model is frozen: `forward`/`backward` never make a gradient of a base
weight (no dW product, no (L, ...) gradient stack), only of the adapters. An adapter's arrays
are stacked per layer as the base's: lora_A.<t> (L, r, n) and lora_B.<t> (L, m, r) for target
t of (n in, m out), peft's layout for each layer's slice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..lora import LoraCache, lora_backward, lora_forward, lora_init
from .blas import one_blas_thread
from .config import Config

# Shape legend: L layers, r rank, d width, dq = H * hd query width, dkv = Hkv * hd key/value
# width; each target maps n inputs to m outputs.

# target -> (the base weight it adapts, the Hugging Face module under each layer)
TARGETS: dict[str, tuple[str, str]] = {
    "q": ("wq", "self_attn.q_proj"),
    "k": ("wk", "self_attn.k_proj"),
    "v": ("wv", "self_attn.v_proj"),
    "o": ("wo", "self_attn.o_proj"),
}
NOT_YET = ("gate", "up", "down")  # the SwiGLU projections: refused in one line, not ignored
PREFIX = "lora_"  # every adapter array's name starts with it; no base parameter's does


def target_size(cfg: Config, target: str) -> tuple[int, int]:
    """(n in, m out) of the projection `target` of `cfg`."""
    return {"q": (cfg.n_embd, cfg.q_dim), "k": (cfg.n_embd, cfg.kv_dim),
            "v": (cfg.n_embd, cfg.kv_dim), "o": (cfg.q_dim, cfg.n_embd)}[target]


@dataclass(frozen=True)
class LoraSpec:
    """Which projections get an adapter, of which rank, scaled by alpha / rank (peft's rule)."""

    rank: int
    alpha: float = 16.0
    targets: tuple[str, ...] = ("q", "v")  # peft's default for LLaMA: q_proj, v_proj

    def __post_init__(self) -> None:
        r = self.rank
        if isinstance(r, bool) or not isinstance(r, (int, np.integer)) or r < 1:
            raise ValueError(f"lora rank must be a positive integer, got {r!r}")
        a = self.alpha
        if isinstance(a, bool) or not isinstance(a, (int, float, np.number)) or not (
                0 < a < float("inf")):
            raise ValueError(f"lora alpha must be a positive number, got {a!r}")
        if isinstance(self.targets, str) or not isinstance(self.targets, (tuple, list)):
            raise TypeError(f"lora targets must be a tuple of names, got {self.targets!r}")
        for t in self.targets:
            if t in NOT_YET:
                raise ValueError(f"lora target {t!r}: adapters on the SwiGLU projections are "
                                 f"not supported yet; choose among {', '.join(TARGETS)}")
            if t not in TARGETS:
                raise ValueError(f"lora target {t!r} is unknown; choose among "
                                 f"{', '.join(TARGETS)}")
        if not self.targets or len(set(self.targets)) != len(self.targets):
            raise ValueError(f"lora targets must name each projection once, got {self.targets!r}")
        # one canonical order (the model's): q,v and v,q are one spec
        object.__setattr__(self, "targets", tuple(t for t in TARGETS if t in self.targets))

    @property
    def scale(self) -> float:
        """alpha / rank: what multiplies each adapter's output."""
        return float(self.alpha) / int(self.rank)


class Adapters(NamedTuple):
    """A model's adapters: the spec and the arrays ({"lora_A.q": (L, r, d), ...})."""

    spec: LoraSpec
    weights: dict[str, np.ndarray]


class LayerLora(NamedTuple):
    """One layer's adapters, as the attention block takes them: target -> A (r, n), B (m, r)."""

    scale: float
    A: dict[str, np.ndarray]
    B: dict[str, np.ndarray]


def adapter_shapes(cfg: Config, spec: LoraSpec) -> dict[str, tuple[int, ...]]:
    """The adapter arrays of `spec` on `cfg`, in the model's order: lora_A.<t>, lora_B.<t>.

    The one door to their sizes, so it is where the rank is bounded, before anything is
    allocated: above min(in, out) of a projection an adapter is a full-rank product that costs
    more than the weight it adapts (ValueError naming the projection)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for t in spec.targets:
        n, m = target_size(cfg, t)
        if spec.rank > min(n, m):
            raise ValueError(f"lora rank {spec.rank} is more than projection {t}'s "
                             f"min(in, out) = {min(n, m)}: choose a rank of at most that")
        shapes[f"lora_A.{t}"] = (cfg.n_layer, spec.rank, n)
        shapes[f"lora_B.{t}"] = (cfg.n_layer, m, spec.rank)
    return shapes


def init_adapters(cfg: Config, spec: LoraSpec, rng: np.random.Generator,
                  dtype: type = np.float32) -> Adapters:
    """Fresh adapters: each layer's A as peft draws it (kaiming-uniform), B zero (`lora_init`)."""
    weights: dict[str, np.ndarray] = {k: np.empty(s, dtype)
                                      for k, s in adapter_shapes(cfg, spec).items()}
    for t in spec.targets:
        n, m = target_size(cfg, t)
        for l in range(cfg.n_layer):
            weights[f"lora_A.{t}"][l], weights[f"lora_B.{t}"][l] = lora_init(
                n, m, spec.rank, rng, dtype)
    return Adapters(spec, weights)


def check_adapters(adapters: object, cfg: Config, dtype: np.dtype) -> Adapters:
    """The one gate of adapter arrays: exactly the spec's keys and shapes, the base's dtype,
    finite values. Raises TypeError/ValueError naming the array."""
    if not isinstance(adapters, Adapters) or not isinstance(adapters.spec, LoraSpec):
        raise TypeError(f"adapters must be an Adapters(spec, weights), got "
                        f"{type(adapters).__name__}")
    shapes, w = adapter_shapes(cfg, adapters.spec), adapters.weights
    if not isinstance(w, dict) or set(w) != set(shapes):
        got = sorted(w) if isinstance(w, dict) else type(w).__name__
        raise ValueError(f"adapters hold {got}, the spec asks for {sorted(shapes)}")
    for k, shape in shapes.items():
        a = w[k]
        if not isinstance(a, np.ndarray) or a.shape != shape or a.dtype != dtype:
            desc = (f"{a.shape} {a.dtype}" if isinstance(a, np.ndarray) else type(a).__name__)
            raise ValueError(f"adapters['{k}'] is {desc}; the model needs {shape} {dtype}")
        if not np.isfinite(a).all():
            raise ValueError(f"adapters['{k}'] holds non-finite values")
    return adapters


def layer_lora(adapters: Adapters, l: int) -> LayerLora:
    """Layer l's slice of every adapter (views)."""
    w = adapters.weights
    return LayerLora(adapters.spec.scale, {t: w[f"lora_A.{t}"][l] for t in adapters.spec.targets},
                     {t: w[f"lora_B.{t}"][l] for t in adapters.spec.targets})


def merged(params: dict[str, np.ndarray], adapters: Adapters) -> dict[str, np.ndarray]:
    """The base parameters with each adapter folded into its weight: W + scale * A.T @ B.T per
    layer (our (in, out) layout), the one model that computes what base plus adapters do.
    The inputs are not changed; unadapted weights are the same arrays."""
    out = dict(params)
    s = adapters.spec.scale
    for t in adapters.spec.targets:
        name = TARGETS[t][0]
        A, B = adapters.weights[f"lora_A.{t}"], adapters.weights[f"lora_B.{t}"]
        delta = np.matmul(A.transpose(0, 2, 1), B.transpose(0, 2, 1))  # (L, n, m)
        out[name] = (params[name] + s * delta).astype(params[name].dtype)
    return out


__all__ = ["NOT_YET", "PREFIX", "TARGETS", "Adapters", "LayerLora", "LoraSpec",
           "adapter_shapes", "check_adapters", "init_adapters", "layer_lora", "merged",
           "target_size"]


def qkv_columns(dq: int, dkv: int) -> dict[str, slice]:
    """The columns of q, k and v in the fused product [q | k | v] (N, dq + 2dkv)."""
    return {"q": slice(0, dq), "k": slice(dq, dq + dkv), "v": slice(dq + dkv, dq + 2 * dkv)}


def adapt_qkv(qkv: np.ndarray, xb: np.ndarray, lora: LayerLora, cfg: Config
              ) -> dict[str, LoraCache]:
    """Each adapter of q, k, v added, in place, to its columns of qkv (N, dq + 2dkv): the frozen
    product's output plus scale * (xb @ A.T) @ B.T. Returns their caches by target."""
    caches = {}
    rank = next(iter(lora.A.values())).shape[0]
    with one_blas_thread(qkv.shape[0], qkv.shape[1], rank):  # thin products
        for t, cols in qkv_columns(cfg.q_dim, cfg.kv_dim).items():
            if t in lora.A:
                delta, caches[t] = lora_forward(xb, lora.A[t], lora.B[t], lora.scale)  # (N, m)
                qkv[:, cols] += delta
    return caches


def lora_qkv_grads(dqkv: np.ndarray, dxb: np.ndarray, caches: dict[str, LoraCache],
                    grads: dict, dq: int, dkv: int) -> None:
    """The adapters of q, k, v in reverse: each reads its columns of dqkv (N, dq + 2dkv); their
    dA, dB go into grads, their dx add (in place) to dxb (N, d): xb fans out to them too."""
    rank = max((c.u.shape[1] for c in caches.values()), default=0)
    with one_blas_thread(dqkv.shape[0], dqkv.shape[1], rank):  # thin products
        for t, cols in qkv_columns(dq, dkv).items():
            if t in caches:
                dx, grads[f"lora_A.{t}"], grads[f"lora_B.{t}"] = lora_backward(dqkv[:, cols],
                                                                               caches[t])
                dxb += dx
