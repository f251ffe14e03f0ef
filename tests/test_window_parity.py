"""Mistral's sliding window against transformers, through every path of ours: the flash path
(any block size) and the KV-cache decoding (a ring of `window` positions per layer) give the
logits and gradients transformers gives, within 1e-10 in float64 (tests/hf_exact.py)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from families import NARROW, NEW, reduced, tiny_model  # noqa: E402
from hf_exact import assert_grads_match, their_step  # noqa: E402

from xenith_edu.model import loss_and_grads  # noqa: E402
from xenith_edu.model.generate import _feed, _prepare, empty_kv_cache  # noqa: E402
from xenith_edu.model.hf import read_hf  # noqa: E402

V, S = 40, 13


@pytest.mark.parametrize("block", [1, 3, 4, 64])
def test_mistral_window_in_the_flash_path_and_the_kv_cache(tmp_path, rng, block):
    family = "Mistral-7B-v0.1"
    m = tiny_model({**reduced(NEW[family], layers=2, vocab=V), **NARROW[family]}, scale=0.4,
                   dtype=torch.float64)
    m.save_pretrained(tmp_path / "hf")
    model = read_hf(tmp_path / "hf", np.float64)
    cfg = replace(model.config, attention="flash", flash_block=block)
    assert cfg.sliding_window == 4 < S
    x, y = rng.integers(0, V, (2, S)), rng.integers(0, V, (2, S))
    want, loss = their_step(m, x, y)
    our_loss, grads = loss_and_grads(model.params, cfg, x, y)
    assert abs(our_loss - loss) <= 1e-10
    assert_grads_match(grads, cfg, m)
    w, kv = _prepare(model.params, cfg), empty_kv_cache(cfg, np.float64)
    assert all(a.shape[2] == 4 for a in kv.k + kv.v)  # the window's positions, no more
    first = _feed(model.params, cfg, w, kv, x[0, :6], 0)  # a prompt longer than the window
    assert np.abs(first - want[0, 5]).max() <= 1e-10
    for t in range(6, S):
        assert np.abs(_feed(model.params, cfg, w, kv, x[0, t : t + 1], t) - want[0, t]).max() \
            <= 1e-10
