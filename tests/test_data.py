"""Tests of xenith_edu.data: the character tokenizer, text loading, the split and the batches."""

import numpy as np
import pytest

from xenith_edu.data import (
    DEFAULT_TEXT,
    CharTokenizer,
    get_batch,
    load_text,
    prepare_data,
    split_ids,
)


def test_tokenizer_round_trip_and_sorted_vocab():
    text = "to be, or not to be:\nthat is the question."
    tok = CharTokenizer.from_text(text)
    assert tok.vocab == "".join(sorted(set(text)))
    assert tok.vocab_size == len(set(text))
    ids = tok.encode(text)
    assert ids.dtype == np.int64 and ids.shape == (len(text),)
    assert tok.decode(ids) == text
    # id i is the i-th vocabulary character
    assert [tok.vocab[i] for i in ids[:5]] == list(text[:5])


def test_tokenizer_handles_non_ascii_characters():
    text = "naïve café — 東京\n"
    tok = CharTokenizer.from_text(text)
    assert tok.decode(tok.encode(text)) == text


def test_unknown_characters_raise_naming_them():
    tok = CharTokenizer.from_text("abc")
    with pytest.raises(ValueError) as e:
        tok.encode("abXcé")
    msg = str(e.value)
    assert "'X'" in msg and "'é'" in msg and "position 2" in msg


def test_decode_rejects_out_of_range_ids():
    tok = CharTokenizer.from_text("abc")
    with pytest.raises(ValueError, match=r"\[0, 3\)"):
        tok.decode([0, 3])


def test_tokenizer_rejects_bad_vocab():
    with pytest.raises(ValueError, match="repeated"):
        CharTokenizer("aab")
    with pytest.raises(ValueError, match="sorted"):
        CharTokenizer("ba")
    with pytest.raises(TypeError, match="vocab"):
        CharTokenizer(["a", "b"])


def test_shipped_corpus_loads_by_default():
    text = load_text()
    assert text == load_text(DEFAULT_TEXT)
    assert len(text) == 1_125_469  # the figure in data/PROVENANCE.md
    assert CharTokenizer.from_text(text).vocab_size == 76


def test_load_text_errors(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_text(tmp_path / "missing.txt")
    with pytest.raises(ValueError, match="is a directory"):
        load_text(tmp_path)
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match="is empty"):
        load_text(empty)
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("café au lait".encode("latin-1"))
    with pytest.raises(ValueError, match=r"not UTF-8 \(byte 0xe9 at offset 3\)"):
        load_text(latin1)


def test_split_is_first_90_last_10_percent():
    ids = np.arange(1000)
    train, val = split_ids(ids)
    assert len(train) == 900 and len(val) == 100
    np.testing.assert_array_equal(np.concatenate([train, val]), ids)


def test_prepare_data_checks_both_splits_are_long_enough():
    text = "abcdefghij" * 40  # 400 characters: validation split of 40 tokens
    tok, train, val = prepare_data(text, seq_len=39)  # needs 40 per split: just enough
    assert len(val) == 40 and tok.vocab_size == 10
    with pytest.raises(ValueError, match="validation split has 40 tokens, but seq_len 40"):
        prepare_data(text, seq_len=40)


def test_prepare_data_with_a_given_tokenizer_checks_characters():
    tok = CharTokenizer.from_text("abc")
    with pytest.raises(ValueError, match="'d'"):
        prepare_data("abcd" * 100, seq_len=4, tokenizer=tok)


def test_get_batch_windows_and_shifted_targets():
    data = np.arange(100, 200)
    rng = np.random.default_rng(0)
    x, y = get_batch(data, 5, 8, rng)
    assert x.shape == y.shape == (5, 8)
    np.testing.assert_array_equal(y[:, :-1], x[:, 1:])  # y is x shifted by one
    for row_x, row_y in zip(x, y, strict=True):
        s = row_x[0] - 100  # each row is a contiguous window of data
        np.testing.assert_array_equal(row_x, data[s:s + 8])
        np.testing.assert_array_equal(row_y, data[s + 1:s + 9])


def test_get_batch_reaches_every_window_and_no_further():
    data = np.arange(10)
    x, y = get_batch(data, 200, 8, np.random.default_rng(1))
    assert set(x[:, 0].tolist()) == {0, 1}  # starts 0 and 1: the last window ends at data[9]
    assert y.max() == 9


def test_get_batch_is_deterministic_given_the_generator():
    data = np.arange(1000)
    a = get_batch(data, 4, 16, np.random.default_rng(7))
    b = get_batch(data, 4, 16, np.random.default_rng(7))
    c = get_batch(data, 4, 16, np.random.default_rng(8))
    np.testing.assert_array_equal(a[0], b[0])
    assert not np.array_equal(a[0], c[0])


def test_get_batch_errors():
    with pytest.raises(TypeError, match="rng"):
        get_batch(np.arange(100), 2, 8, 0)
    with pytest.raises(ValueError, match="seq_len"):
        get_batch(np.arange(8), 2, 8, np.random.default_rng(0))
