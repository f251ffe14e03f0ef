"""Tests of the data: the character tokenizer, text loading, the split and the batches."""

import numpy as np
import pytest

from xenith_edu.training.data import (
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


# ---- the boundaries of the tokenizer, the split and the batches, with their exact messages ----

def test_empty_vocabulary_is_refused():
    msg = r"^vocab is empty: build the tokenizer from a non-empty text$"
    with pytest.raises(ValueError, match=msg):
        CharTokenizer("")
    with pytest.raises(ValueError, match=msg):
        CharTokenizer.from_text("")


def test_bad_vocab_messages():
    with pytest.raises(ValueError, match=r"^vocab has repeated characters: each character must "
                       r"appear once$"):
        CharTokenizer("abb")
    with pytest.raises(ValueError, match=r"^vocab must be sorted by code point, as from_text "
                       r"makes it$"):
        CharTokenizer("acb")
    with pytest.raises(TypeError, match=r"^vocab must be a str of distinct characters, got "
                       r"list$"):
        CharTokenizer(["a"])
    with pytest.raises(TypeError, match=r"^text must be a str, got bytes$"):
        CharTokenizer.from_text(b"abc")
    with pytest.raises(TypeError, match=r"^text must be a str, got int$"):
        CharTokenizer("abc").encode(3)


@pytest.mark.parametrize("ids", [[-1], [0, -1, 1], [3], [0, 1, 2, 3], [0.0, 1.0], ["a"]])
def test_decode_refuses_ids_outside_the_vocabulary(ids):
    tok = CharTokenizer("abc")
    with pytest.raises(ValueError, match=r"^ids must be integers in \[0, 3\)$"):
        tok.decode(ids)


def test_decode_edges():
    tok = CharTokenizer("abc")
    assert tok.decode([]) == "" and tok.decode(np.array([], dtype=np.int64)) == ""
    assert tok.decode([0, 2]) == "ac"  # the first and the last id
    assert tok.decode(np.array([[2, 1], [0, 0]], dtype=np.uint8)) == "cbaa"  # any shape, uint
    assert tok.vocab_size == 3 and repr(tok) == "CharTokenizer(vocab_size=3)"


def test_encode_the_last_and_first_characters_and_beyond():
    tok = CharTokenizer("bdf")
    np.testing.assert_array_equal(tok.encode("fdb"), [2, 1, 0])
    for outside, pos in (("g", 0), ("a", 0), ("c", 0), ("bbz", 2)):
        with pytest.raises(ValueError, match=f"^text has 1 character\\(s\\) outside the "
                           f"vocabulary: '{outside[-1]}' \\(first at position {pos}\\); use only "
                           "characters the model was trained on$"):
            tok.encode(outside)


def test_many_unknown_characters_are_summarised():
    tok = CharTokenizer("a")
    with pytest.raises(ValueError) as e:
        tok.encode("a" + "bcdefghijklm")
    msg = str(e.value)
    assert msg.startswith("text has 12 character(s) outside the vocabulary: 'b', 'c', 'd', 'e', "
                          "'f', 'g', 'h', 'i', 'j', 'k' and 2 more (first at position 1)")
    with pytest.raises(ValueError, match=r"outside the vocabulary: 'b', 'c', 'd', 'e', 'f', 'g', "
                       r"'h', 'i', 'j', 'k' \(first"):
        tok.encode("bcdefghijk")  # exactly ten: no "and more"


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.5, 1.5])
def test_split_fraction_must_leave_both_sides(fraction):
    with pytest.raises(ValueError, match=f"^train_fraction must be in \\(0, 1\\), got {fraction}$"):
        split_ids(np.arange(10), fraction)


def test_split_with_another_fraction():
    train, val = split_ids(np.arange(10), 0.5)
    np.testing.assert_array_equal(train, np.arange(5))
    np.testing.assert_array_equal(val, np.arange(5, 10))
    train, val = split_ids(np.arange(10), 0.01)  # int(0.1) = 0: everything validates
    assert len(train) == 0 and len(val) == 10


def test_prepare_data_message_gives_a_length_that_is_enough():
    text = "abcdefghij" * 40
    with pytest.raises(ValueError, match=r"^text is too short: its validation split has 40 "
                       r"tokens, but seq_len 40 needs at least 41 in each split; use a text of "
                       r"at least 412 characters or a shorter seq_len$"):
        prepare_data(text, seq_len=40)
    ok = ("abcdefghij" * 42)[:412]
    _, train, val = prepare_data(ok, seq_len=40)  # the length the message asks for is enough
    assert len(train) >= 41 and len(val) >= 41
    with pytest.raises(ValueError, match=r"^text is too short: its training split has 9 tokens"):
        prepare_data("abcdefghij", seq_len=10)  # both too short: the training split is named


def test_load_text_unreadable(tmp_path, monkeypatch):
    from pathlib import Path

    path = tmp_path / "t.txt"
    path.write_text("hello")

    def denied(self):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "read_bytes", denied)
    with pytest.raises(ValueError, match=f"^text file '{path}' cannot be read \\(Permission "
                       "denied\\): check its permissions$"):
        load_text(path)


def test_load_text_messages(tmp_path):
    with pytest.raises(ValueError, match=f"^text file '{tmp_path / 'm.txt'}' does not exist: pass "
                       "the path of a UTF-8 text file$"):
        load_text(tmp_path / "m.txt")
    with pytest.raises(ValueError, match=f"^text file '{tmp_path}' is a directory: pass the path "
                       "of a UTF-8 text file$"):
        load_text(tmp_path)
    (tmp_path / "e.txt").write_bytes(b"")
    with pytest.raises(ValueError, match=f"^text file '{tmp_path / 'e.txt'}' is empty: pass a "
                       "text file with some text in it$"):
        load_text(tmp_path / "e.txt")
    (tmp_path / "l.txt").write_bytes("é".encode("latin-1"))
    with pytest.raises(ValueError, match=r"not UTF-8 \(byte 0xe9 at offset 0\): save it as UTF-8 "
                       r"and try again$"):
        load_text(tmp_path / "l.txt")
    (tmp_path / "u.txt").write_bytes("é\n".encode())
    assert load_text(str(tmp_path / "u.txt")) == "é\n"  # a str path works too


def test_get_batch_messages_and_the_smallest_data():
    with pytest.raises(TypeError, match=r"^rng must be a np\.random\.Generator, e\.g\. "
                       r"np\.random\.default_rng\(seed\)$"):
        get_batch(np.arange(100), 2, 8, np.random.RandomState(0))
    with pytest.raises(ValueError, match=r"^data has 8 tokens, fewer than seq_len \+ 1 = 9$"):
        get_batch(np.arange(8), 2, 8, np.random.default_rng(0))
    x, y = get_batch(np.arange(9), 3, 8, np.random.default_rng(0))  # exactly one window
    np.testing.assert_array_equal(x, np.tile(np.arange(8), (3, 1)))
    np.testing.assert_array_equal(y, np.tile(np.arange(1, 9), (3, 1)))
