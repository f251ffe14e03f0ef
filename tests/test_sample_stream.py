"""Sampling streams: `sample_text(on_text=...)` sends the text as each token comes, and the
pieces joined are exactly the returned text, whatever the seed, the prompt and the tokenizer
(byte-level BPE, whose tokens may end in half a character, included); the command line prints
the same text as it comes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import xenith_edu as xe
from xenith_edu.model import random_params
from xenith_edu.model.generate import sample_text
from xenith_edu.model.tokenizer import BPETokenizer, CharTokenizer

CHARS = CharTokenizer("\n abcdefgh")


def model(V: int, **kw):
    cfg = xe.Config(vocab_size=V, n_embd=16, n_head=2, n_layer=1, seq_len=12, **kw)
    return cfg, random_params(cfg, np.random.default_rng(0), scale=0.6, dtype=np.float32)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**16), prompt=st.text("abcdefgh \n", min_size=1, max_size=6),
       new=st.integers(0, 20), window=st.none() | st.integers(1, 5))
def test_streamed_pieces_are_the_text(seed, prompt, new, window):
    cfg, params = model(CHARS.vocab_size, sliding_window=window)
    pieces: list[str] = []
    text = sample_text(params, cfg, CHARS, prompt, new, 1.0, None, seed, on_text=pieces.append)
    assert "".join(pieces) == text and pieces[0] == prompt
    assert len(pieces) == new + 1  # one piece per token: a character is always whole
    assert text == sample_text(params, cfg, CHARS, prompt, new, 1.0, None, seed)


def test_byte_level_pieces_never_split_a_character():
    pytest.importorskip("tokenizers")
    from families import bpe_json

    tok = BPETokenizer(bpe_json())
    cfg, params = model(tok.vocab_size)
    for seed in range(8):
        pieces: list[str] = []
        text = sample_text(params, cfg, tok, "First", 24, 1.5, None, seed, on_text=pieces.append)
        assert "".join(pieces) == text
        # a piece never ends in half a character (the decoder's replacement mark): it waits
        # for the bytes that complete it; bytes that never can stay marked, as decode shows
        assert not any(p.endswith("\ufffd") for p in pieces[:-1])


def test_the_command_line_prints_the_sampled_text(tmp_path, capsys):
    from xenith_edu.cli import main
    from xenith_edu.training.checkpoint import save_checkpoint

    cfg, params = model(CHARS.vocab_size)
    zeros = {k: np.zeros_like(p) for k, p in params.items()}
    save_checkpoint(tmp_path / "ckpt.npz", params, zeros, dict(zeros), 0,
                    np.random.default_rng(0), cfg, CHARS.vocab, {}, None)
    assert main(["sample", str(tmp_path), "--prompt", "ab", "--chars", "9", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert out == sample_text(params, cfg, CHARS, "ab", 9, temperature=0.8, seed=3) + "\n"
