"""The "Your backward inside PyTorch" chapter's code, tested on more shapes than the chapter shows.

The Functions, the two PyTorch models and the conversions are the chapter's own cells (those
tagged "bridge"), run here once: one source, no copy. Every Function passes gradcheck; the
whole model's gradients match PyTorch autograd's to 1e-10 (float64), tied and untied.
torch is a test dependency (the `torch` extra, which `make test` installs): this module fails,
it does not skip, when torch is missing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

try:
    import torch
    from torch.autograd import gradcheck
except ImportError as exc:  # fail loudly: CI must never skip the chapter's checks
    raise ImportError("torch is not installed: `make test` installs the project's `torch` "
                      "extra (pip install -e '.[torch]')") from exc

import xenith_edu as xe
from xenith_edu.model.hf import pair_rows
from xenith_edu.model.params import random_params

# Shape legend: B batch, S positions, N = B*S, d width, H heads, hd head width, f hidden,
# V vocab, L layers.

pytestmark = pytest.mark.usefixtures("one_thread_each")  # conftest.py: nothing here counts threads
ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "torch.ipynb"


def _chapter() -> dict:
    """The namespace of the chapter's cells tagged "bridge", run in order."""
    nb = json.loads(NOTEBOOK.read_text(encoding="utf-8"))
    cells = [c for c in nb["cells"] if c["cell_type"] == "code"
             and "bridge" in c.get("metadata", {}).get("tags", [])]
    namespace: dict = {"__name__": "torch_chapter"}
    for c in cells:
        exec(compile("".join(c["source"]), f"{NOTEBOOK.name} (bridge cell)", "exec"), namespace)
    return namespace


NB = _chapter()


def _leaf(rng: np.random.Generator, *shape: int, shift: float = 0.0,
          scale: float = 1.0) -> torch.Tensor:
    a = shift + scale * rng.standard_normal(shape)
    return torch.tensor(a, dtype=torch.float64, requires_grad=True)


def _max_rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def test_the_chapter_defines_what_is_tested() -> None:
    for name in ("RMSNorm", "Linear", "SwiGLU", "Attention", "RoPE", "Embedding",
                 "CrossEntropy", "bridge_loss", "TorchModel", "torch_loss", "load_ours",
                 "grads_in_our_layout", "rope_interleaved", "rope_half", "half_permutation",
                 "saved_bytes", "cache_bytes"):
        assert name in NB, f"the chapter's bridge cells no longer define {name}"
    assert issubclass(NB["RMSNorm"], torch.autograd.Function)


# ---------------------------------------------------------------- each Function: gradcheck
def _function_cases(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    B, S, H, hd = (int(rng.integers(lo, hi)) for lo, hi in [(1, 3), (2, 6), (1, 3), (1, 4)])
    hd *= 2  # even
    d, f, V = (int(rng.integers(lo, hi)) for lo, hi in [(3, 7), (3, 9), (2, 6)])
    eps = float(10 ** rng.uniform(-6, -3))
    theta = float(10 ** rng.uniform(2, 5))
    cos, sin = (torch.from_numpy(t) for t in xe.rope.rope_tables(S, hd, theta))
    ids = torch.from_numpy(rng.integers(0, V, (B, S)))
    F = NB  # the chapter's Functions
    return {
        "RMSNorm": (lambda x, w: F["RMSNorm"].apply(x, w, eps),
                    (_leaf(rng, B, S, d), _leaf(rng, d, shift=1.0, scale=0.3))),
        "Linear": (F["Linear"].apply, (_leaf(rng, B, S, d), _leaf(rng, d, f))),
        "SwiGLU": (F["SwiGLU"].apply, (_leaf(rng, B, S, d), _leaf(rng, d, f), _leaf(rng, d, f),
                                       _leaf(rng, f, d))),
        "Attention": (F["Attention"].apply, tuple(_leaf(rng, B, H, S, hd) for _ in range(3))),
        "RoPE": (lambda u: F["RoPE"].apply(u, cos, sin), (_leaf(rng, B, H, S, hd),)),
        "Embedding": (lambda wte: F["Embedding"].apply(wte, ids), (_leaf(rng, V, d),)),
        "CrossEntropy": (lambda z: F["CrossEntropy"].apply(z, ids), (_leaf(rng, B, S, V),)),
    }


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", ["RMSNorm", "Linear", "SwiGLU", "Attention", "RoPE",
                                  "Embedding", "CrossEntropy"])
def test_every_function_passes_gradcheck(name: str, seed: int) -> None:
    fn, inputs = _function_cases(seed)[name]
    assert gradcheck(fn, inputs)


def test_gradcheck_catches_a_wrong_backward() -> None:
    """The chapter's broken RMSNorm (no projection term) must fail: the check can fail."""

    class NoProjection(NB["RMSNorm"]):
        @staticmethod
        def backward(ctx, dy):
            c = NB["load_cache"](ctx)
            dw = (NB["npy"](dy) * c.xhat).reshape(-1, c.xhat.shape[-1]).sum(axis=0)
            return torch.from_numpy(NB["npy"](dy) * c.w * c.rstd), torch.from_numpy(dw), None

    rng = np.random.default_rng(3)
    x, w = _leaf(rng, 2, 4, 6), _leaf(rng, 6, shift=1.0, scale=0.3)
    assert not gradcheck(lambda x, w: NoProjection.apply(x, w, 1e-5), (x, w),
                         raise_exception=False)


def test_the_cache_goes_through_ctx_unchanged() -> None:
    """save_cache / load_cache give the backward the very NamedTuple the forward made."""
    x = np.random.default_rng(4).standard_normal((3, 5))
    y, cache = xe.rmsnorm.rmsnorm_forward(x, np.ones(5), 1e-5)

    class Ctx:
        def save_for_backward(self, *tensors):
            self.saved_tensors = tensors

    ctx = Ctx()
    NB["save_cache"](ctx, cache)
    back = NB["load_cache"](ctx)
    assert type(back) is type(cache)
    for a, b in zip(back, cache, strict=True):
        assert np.shares_memory(a, b) and np.array_equal(a, b)


# ---------------------------------------------------------------- the whole model
def _config(kind: str, tie: bool) -> xe.Config:
    if kind == "book":  # the chapter's sizes
        return xe.Config(vocab_size=76, n_embd=128, n_head=4, n_layer=4, seq_len=64,
                         tie_embeddings=tie)
    # small and unusual: 3 heads of width 6 (RoPE's permutation is not its own inverse there),
    # a hidden width that is not LLaMA's, an odd vocabulary
    return xe.Config(vocab_size=13, n_embd=18, n_head=3, n_layer=2, ffn_hidden=20, seq_len=9,
                     tie_embeddings=tie, rope_theta=500.0, norm_eps=1e-6)


def _setup(kind: str, tie: bool, seed: int = 0):
    cfg = _config(kind, tie)
    rng = np.random.default_rng(seed)
    params = random_params(cfg, rng)  # float64, non-degenerate
    B, S = (2, cfg.seq_len) if kind == "book" else (3, 7)
    x, y = (rng.integers(0, cfg.vocab_size, (B, S)) for _ in range(2))
    return cfg, params, x, y


@pytest.mark.parametrize("kind", ["book", "small"])
@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_torch_nn_model_matches_our_gradients(kind: str, tie: bool) -> None:
    cfg, params, x, y = _setup(kind, tie)
    loss, grads = xe.loss_and_grads(params, cfg, x, y)
    model = NB["load_ours"](NB["TorchModel"](cfg).double(), params)
    t_loss = NB["torch_loss"](model, torch.from_numpy(x), torch.from_numpy(y))
    t_loss.backward()
    theirs = NB["grads_in_our_layout"](model)
    assert sorted(theirs) == sorted(grads)
    assert abs(t_loss.item() - loss) <= 1e-10 * loss
    worst = {k: _max_rel(theirs[k], grads[k]) for k in grads}
    assert max(worst.values()) < 1e-10, worst


@pytest.mark.parametrize("kind", ["book", "small"])
@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_model_of_our_functions_matches_the_package(kind: str, tie: bool) -> None:
    cfg, params, x, y = _setup(kind, tie, seed=1)
    loss, grads = xe.loss_and_grads(params, cfg, x, y)
    p = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    b_loss = NB["bridge_loss"](p, cfg, torch.from_numpy(x), torch.from_numpy(y))
    b_loss.backward()
    assert abs(b_loss.item() - loss) <= 1e-12 * loss
    for k in grads:
        assert _max_rel(p[k].grad.numpy(), grads[k]) < 1e-12, k


def test_a_wrong_layout_is_caught() -> None:
    """Loading wq without its transpose gives a different model: the comparison can fail."""
    cfg, params, x, y = _setup("small", True)
    loss, _ = xe.loss_and_grads(params, cfg, x, y)
    wrong = {**params, "wq": np.swapaxes(params["wq"], 1, 2)}
    model = NB["load_ours"](NB["TorchModel"](cfg).double(), wrong)
    t_loss = NB["torch_loss"](model, torch.from_numpy(x), torch.from_numpy(y)).item()
    assert abs(t_loss - loss) > 1e-6 * loss


# ---------------------------------------------------------------- RoPE conventions
@pytest.mark.parametrize("kind", ["book", "small"])
def test_rotate_half_model_with_permuted_weights_is_our_model(kind: str) -> None:
    cfg, params, x, y = _setup(kind, True, seed=2)
    loss, grads = xe.loss_and_grads(params, cfg, x, y)
    sd = NB["half_permutation"](cfg.n_embd, cfg.n_head)
    half = {**params, "wq": params["wq"][:, :, sd], "wk": params["wk"][:, :, sd]}
    model = NB["load_ours"](NB["TorchModel"](cfg).double(), half)
    t_loss = NB["torch_loss"](model, torch.from_numpy(x), torch.from_numpy(y),
                              rope=NB["rope_half"])
    t_loss.backward()
    theirs = NB["grads_in_our_layout"](model)
    assert abs(t_loss.item() - loss) <= 1e-10 * loss
    for k in grads:
        ours = grads[k][:, :, sd] if k in ("wq", "wk") else grads[k]
        assert _max_rel(theirs[k], ours) < 1e-10, k
    plain = NB["load_ours"](NB["TorchModel"](cfg).double(), params)  # not permuted: differs
    p_loss = NB["torch_loss"](plain, torch.from_numpy(x), torch.from_numpy(y),
                              rope=NB["rope_half"]).item()
    assert abs(p_loss - loss) > 1e-6 * loss


@pytest.mark.parametrize("d,n_head", [(8, 1), (12, 2), (24, 4), (18, 3), (10, 5)])
def test_the_package_reading_undoes_the_chapter_permutation(d: int, n_head: int) -> None:
    """A rotate-half checkpoint (nn.Linear layout) made with the chapter's tau_d converts
    back to our W_q with the package's reading map, pair_rows: the two are written
    independently."""
    wq = np.random.default_rng(d).standard_normal((d, d))  # ours, (in, out)
    checkpoint = wq[:, NB["half_permutation"](d, n_head)].T  # (out, in), rotate-half order
    assert np.array_equal(checkpoint[pair_rows(n_head, d // n_head)].T, wq)


def test_rope_identity_on_random_heads() -> None:
    rng = np.random.default_rng(5)
    for S, hd in [(5, 6), (7, 8), (3, 10)]:
        cos, sin = (torch.from_numpy(t) for t in xe.rope.rope_tables(S, hd, 1000.0))
        u = torch.from_numpy(rng.standard_normal((2, 3, S, hd)))
        tau = torch.from_numpy(NB["half_permutation"](hd, 1))
        left = NB["rope_half"](u[..., tau], cos, sin)
        right = NB["rope_interleaved"](u, cos, sin)[..., tau]
        assert torch.allclose(left, right, rtol=0, atol=1e-14)
        ours = xe.rope.rope_forward(u.numpy(), cos.numpy(), sin.numpy())[0]
        assert np.allclose(NB["rope_interleaved"](u, cos, sin).numpy(), ours, rtol=0, atol=1e-14)


# ---------------------------------------------------------------- memory accounting
def test_bridge_saves_exactly_our_caches() -> None:
    """What autograd keeps for a Function is what our cache holds (the views' own bytes)."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((4, 5, 8))
    w = rng.standard_normal(8)
    sizes = []

    def pack(t):
        sizes.append(t.numel() * t.element_size())
        return t

    xt, wt = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        NB["RMSNorm"].apply(xt, wt, 1e-5)
    _, cache = xe.rmsnorm.rmsnorm_forward(x, w, 1e-5)
    assert sizes == [a.nbytes for a in cache if isinstance(a, np.ndarray)]


def test_saved_bytes_counts_each_storage_once_and_skips_parameters() -> None:
    """Three products of one input save that input three times: it is counted once."""
    x = torch.randn(6, 4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    run = lambda: (x @ w).sum() + (x @ w).sum() + (x.t().t() @ w).sum()  # noqa: E731
    assert NB["saved_bytes"](run, [w]) == x.numel() * 8
    assert NB["saved_bytes"](run, []) == (x.numel() + w.numel()) * 8


def test_cache_bytes_counts_each_owner_once_and_skips_parameters() -> None:
    base = np.zeros((10, 4))  # 320 bytes
    w = np.ones(3)
    cache = {"a": base[:5], "b": [base[5:], (base.T, w)], "c": np.zeros(2)}
    assert NB["cache_bytes"](cache, [w]) == base.nbytes + 16
    assert NB["cache_bytes"](cache) == base.nbytes + 16 + w.nbytes


# ---------------------------------------------------------------- the package stays torch-free
def test_the_package_never_imports_torch() -> None:
    """Importing xenith_edu and every one of its modules leaves torch out of sys.modules."""
    code = (
        "import importlib, pkgutil, sys\n"
        "import xenith_edu\n"
        "for m in pkgutil.walk_packages(xenith_edu.__path__, 'xenith_edu.'):\n"
        "    if not m.name.endswith('__main__'):\n"
        "        importlib.import_module(m.name)\n"
        "print(sorted(n for n in sys.modules if n == 'torch' or n.startswith('torch.')))\n"
        "print(len([n for n in sys.modules if n.startswith('xenith_edu')]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout.split("\n")
    assert out[0] == "[]", f"torch was imported: {out[0]}"
    assert int(out[1]) > 20  # the walk really imported the package's modules
