"""Every gate of foreign input, fuzzed through the command line: config.json, a safetensors
header, the shard index, tokenizer.json and a run folder's checkpoint metadata.

Invariant (one per gate, the same words): whatever a file holds, `from-hf` (or `to-hf`,
`train --init`, `sample`) either succeeds or prints ONE line on stderr, exits 1, writes
nothing, and stays within a memory bound (traced here in the process; under RLIMIT_AS and a
timeout in a subprocess for the kinds that once hung or aborted). The inputs are generated:
structural mutations of a valid file (any field replaced by any JSON value, huge integers,
deep nesting, fields removed) and byte mutations (flipped, inserted, cut). XENITH_FUZZ=N runs
N examples per gate instead of the default few.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tracemalloc
from contextlib import redirect_stderr, redirect_stdout
from io import StringIO
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

tokenizers = pytest.importorskip("tokenizers")

from xenith_edu.cli import main  # noqa: E402
from xenith_edu.model import BPETokenizer, Config  # noqa: E402
from xenith_edu.model.hf import write_hf  # noqa: E402
from xenith_edu.model.params import random_params  # noqa: E402
from xenith_edu.tools.boundedjson import nesting, parse_json  # noqa: E402

EXAMPLES = int(os.environ.get("XENITH_FUZZ", "25"))
MEMORY = 200 * 2**20  # bytes of traced allocations one refusal of a tiny model may take
ROOT = Path(__file__).resolve().parent.parent
TEXT = "To be, or not to be, that is the question: whether 'tis nobler in the mind\n" * 8


def fuzz(examples: int = EXAMPLES) -> settings:
    return settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))


def bpe_spec() -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=len(alphabet) + 20, initial_alphabet=alphabet,
                                  special_tokens=["<s>", "</s>", "<unk>"])
    tok.train_from_iterator([TEXT], trainer)
    return tok.to_str()


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A valid tiny Hugging Face folder: config.json, model.safetensors, tokenizer.json."""
    folder = tmp_path_factory.mktemp("gates") / "hf"
    tok = BPETokenizer(bpe_spec())
    cfg = Config(vocab_size=tok.vocab_size + 3, n_embd=16, n_head=2, n_kv_head=1, n_layer=1,
                 ffn_hidden=32, seq_len=16)
    params = random_params(cfg, np.random.default_rng(0), dtype=np.float32)
    write_hf(folder, params, cfg, tok)
    return folder


def cli(argv: list) -> tuple[int, str, str, int]:
    """main(argv) in this process: exit status, stdout, stderr, peak traced bytes."""
    out, err = StringIO(), StringIO()
    tracemalloc.start()
    try:
        with redirect_stdout(out), redirect_stderr(err):
            rc = main([str(a) for a in argv])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return rc, out.getvalue(), err.getvalue(), peak


def limited(argv: list, gigabytes: float = 3.0,
            seconds: float = 120) -> subprocess.CompletedProcess:
    """The command line in a subprocess under an address-space limit and a timeout."""
    cap = int(gigabytes * 2**30)

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    env = {**os.environ, "RAYON_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "xenith_edu", *map(str, argv)],
                          capture_output=True, text=True, timeout=seconds, preexec_fn=limit,
                          cwd=ROOT, env=env)


def refused_or_done(rc: int, out: str, err: str, written: Path) -> bool:
    """The invariant: success, or one line on stderr, status 1, nothing written. True if done.
    XENITH_FUZZ_LOG=FILE appends each outcome to FILE (the test, the status, the line)."""
    if os.environ.get("XENITH_FUZZ_LOG"):
        with open(os.environ["XENITH_FUZZ_LOG"], "a", encoding="utf-8") as f:
            test = os.environ.get("PYTEST_CURRENT_TEST", "?").split("::")[-1].split(" ")[0]
            f.write(json.dumps([test, rc, err.strip()[:300]]) + "\n")
    assert "Traceback" not in err, err
    if rc == 0:
        return True
    assert rc == 1, (rc, err)
    assert len(err.strip().splitlines()) == 1 and err.endswith("\n"), err
    assert not written.exists(), f"{written} written by a refusal: {err}"
    return False


# -- the mutations: any field of a JSON document, or its bytes --------------------------------

HUGE = st.sampled_from([0, -1, 2**31, 2**53 + 1, 2**63, 10**30, 10**4000])
VALUES = st.recursive(st.none() | st.booleans() | st.integers(-10, 10**6) | HUGE
                      | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=6),
                      lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=5)
DEEP = st.integers(60, 3000).map(lambda n: "[" * n + "]" * n)  # raw JSON, spliced in


def _paths(value: object, at: tuple = ()) -> list[tuple]:
    """Every path (keys and indexes) to a field of a JSON value, the root first."""
    out = [at]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*at, k))
    elif isinstance(value, list):
        for i, v in enumerate(value[:4]):  # the first few items of a long list are enough
            out += _paths(v, (*at, i))
    return out


MARK = "\x00deep\x00"


def mutate_json(data, doc: object, only: tuple[str, ...] = ()) -> bytes:
    """`doc` with one to three fields replaced, removed or deeply nested; as bytes."""
    doc = json.loads(json.dumps(doc))
    deep = None
    for _ in range(data.draw(st.integers(1, 3))):
        paths = [p for p in _paths(doc) if p and (not only or p[0] in only)]
        if not paths:
            break
        path = data.draw(st.sampled_from(paths))
        parent = doc
        for k in path[:-1]:
            parent = parent[k]
        how = data.draw(st.sampled_from(["value", "value", "remove", "deep"]))
        if how == "remove" and isinstance(parent, dict):
            del parent[path[-1]]
        elif how == "deep":
            deep = data.draw(DEEP)
            parent[path[-1]] = MARK
        else:
            parent[path[-1]] = data.draw(VALUES)
    raw = json.dumps(doc)
    if deep is not None:
        raw = raw.replace(json.dumps(MARK), deep)
    return raw.encode()


def mutate_bytes(data, raw: bytes, within: int | None = None) -> bytes:
    """`raw` with bytes flipped, inserted or cut (in its first `within` bytes, if given)."""
    raw = bytearray(raw)
    span = min(len(raw), within or len(raw))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, max(span - 1, 0)))
        how = data.draw(st.sampled_from(["flip", "insert", "cut"]))
        if how == "flip" and raw:
            raw[at] ^= data.draw(st.integers(1, 255))
        elif how == "insert":
            raw[at:at] = data.draw(st.binary(min_size=1, max_size=8))
        else:
            del raw[at:at + data.draw(st.integers(1, 16))]
    return bytes(raw)


def copy_of(base: Path, where: Path) -> Path:
    where.mkdir(parents=True)
    for p in base.iterdir():
        (where / p.name).write_bytes(p.read_bytes())
    return where


def _case(base: Path, tmp: Path, name: str, raw: bytes) -> tuple[Path, Path]:
    k = len(list(tmp.glob("case*")))
    folder = copy_of(base, tmp / f"case{k}" / "hf")
    (folder / name).write_bytes(raw)
    return folder, tmp / f"case{k}" / "run"


def _from_hf(folder: Path, out: Path) -> bool:
    rc, stdout, err, peak = cli(["from-hf", folder, "--out", out])
    assert peak < MEMORY, f"{peak / 2**20:.0f} MB traced"
    return refused_or_done(rc, stdout, err, out)


# -- the gates -------------------------------------------------------------------------------


@fuzz()
@given(data=st.data(), by_bytes=st.booleans())
def test_config_json_gate(base, tmp_path_factory, data, by_bytes):
    raw = (base / "config.json").read_bytes()
    raw = mutate_bytes(data, raw) if by_bytes else mutate_json(data, json.loads(raw))
    folder, out = _case(base, tmp_path_factory.mktemp("c"), "config.json", raw)
    _from_hf(folder, out)


def _header(raw: bytes) -> tuple[dict, bytes]:
    n = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8:8 + n]), raw[8 + n:]


@fuzz()
@given(data=st.data(), by_bytes=st.booleans())
def test_safetensors_header_gate(base, tmp_path_factory, data, by_bytes):
    raw = (base / "model.safetensors").read_bytes()
    if by_bytes:
        n = int.from_bytes(raw[:8], "little")
        raw = mutate_bytes(data, raw, within=8 + n)
    else:
        header, body = _header(raw)
        new = mutate_json(data, header)
        raw = len(new).to_bytes(8, "little") + new + body
    folder, out = _case(base, tmp_path_factory.mktemp("s"), "model.safetensors", raw)
    _from_hf(folder, out)


def _sharded(base: Path, where: Path) -> Path:
    """`base` as two shards and an index."""
    from xenith_edu.model.hf import read_safetensors, write_safetensors

    folder = copy_of(base, where)
    tensors = read_safetensors(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    names = sorted(tensors)
    halves = {"a.safetensors": names[::2], "b.safetensors": names[1::2]}
    for file, part in halves.items():
        write_safetensors(folder / file, {k: tensors[k] for k in part})
    index = {"metadata": {}, "weight_map": {k: f for f, ks in halves.items() for k in ks}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return folder


@fuzz()
@given(data=st.data(), by_bytes=st.booleans())
def test_shard_index_gate(base, tmp_path_factory, data, by_bytes):
    tmp = tmp_path_factory.mktemp("i")
    folder = _sharded(base, tmp / "hf")
    raw = (folder / "model.safetensors.index.json").read_bytes()
    raw = mutate_bytes(data, raw) if by_bytes else mutate_json(data, json.loads(raw))
    (folder / "model.safetensors.index.json").write_bytes(raw)
    _from_hf(folder, tmp / "run")


TOKENIZER_FIELDS = ("truncation", "padding", "model", "pre_tokenizer", "normalizer", "decoder",
                    "added_tokens", "post_processor")


@fuzz()
@given(data=st.data(), by_bytes=st.booleans())
def test_tokenizer_json_gate_and_what_follows(base, tmp_path_factory, data, by_bytes):
    raw = (base / "tokenizer.json").read_bytes()
    if by_bytes:
        raw = mutate_bytes(data, raw)
    else:
        spec = json.loads(raw)
        spec["model"]["merges"] = spec["model"]["merges"][:8]  # a few: the paths stay few
        raw = mutate_json(data, spec, TOKENIZER_FIELDS)
    folder, out = _case(base, tmp_path_factory.mktemp("t"), "tokenizer.json", raw)
    if _from_hf(folder, out):  # accepted: the run samples, or refuses its prompt in one line
        rc, stdout, err, _ = cli(["sample", out, "--prompt", "To be", "--chars", "4"])
        assert "Traceback" not in err and (rc == 0 or len(err.strip().splitlines()) == 1)


@pytest.fixture(scope="module")
def converted(base, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("run") / "run"
    rc, _, err, _ = cli(["from-hf", base, "--out", out])
    assert rc == 0, err
    return out


def _edit_meta(src: Path, dst: Path, edit) -> None:
    with np.load(src / "ckpt.npz") as z:
        arrays = {k: z[k] for k in z.files}
    raw = edit(str(arrays["meta"][()]).encode())
    arrays["meta"] = np.array(raw.decode("utf-8", "replace"))
    dst.mkdir(parents=True)
    with open(dst / "ckpt.npz", "wb") as f:
        np.savez(f, **arrays)


@fuzz()
@given(data=st.data(), by_bytes=st.booleans(), command=st.sampled_from(["to-hf", "init"]))
def test_run_folder_metadata_gate(converted, tmp_path_factory, data, by_bytes, command):
    tmp = tmp_path_factory.mktemp("m")
    fields = ("config", "step", "rng_state", "train", "tokenizer", "vocab", "moments",
              "format", "checksums")
    _edit_meta(converted, tmp / "src", lambda raw: mutate_bytes(data, raw) if by_bytes
               else mutate_json(data, json.loads(raw), fields))
    out = tmp / "out"
    if command == "to-hf":
        rc, stdout, err, peak = cli(["to-hf", tmp / "src", "--out", out])
    else:
        (tmp / "text.txt").write_text(TEXT)
        rc, stdout, err, peak = cli(["train", "--init", tmp / "src", "--out", out, "--steps",
                                     "1", "--seq-len", "8", "--batch-size", "2",
                                     "--eval-batches", "1", "--text", tmp / "text.txt",
                                     "--threads", "1", "--no-progress", "--sample-chars", "4"])
    assert peak < MEMORY
    refused_or_done(rc, stdout, err, out)


# -- the kinds that once hung or aborted, in a subprocess under limits ------------------------

def _config_with(base: Path, tmp: Path, **changes) -> Path:
    folder = copy_of(base, tmp)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, **changes}))
    return folder


@pytest.mark.parametrize("changes", [
    {"hidden_size": 2**40}, {"vocab_size": 10**12}, {"num_hidden_layers": 10**9},
    {"intermediate_size": 2**62}, {"num_attention_heads": 10**15, "hidden_size": 10**15},
], ids=["width", "vocab", "layers", "ffn", "heads"])
def test_huge_sizes_are_refused_before_any_allocation(base, tmp_path, changes):
    p = limited(["from-hf", _config_with(base, tmp_path / "hf", **changes), "--out",
                 tmp_path / "run"], gigabytes=2.0, seconds=90)
    assert p.returncode == 1 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "Traceback" not in p.stderr and not (tmp_path / "run").exists()


def test_a_huge_context_costs_only_what_sampling_uses(base, tmp_path):
    folder = _config_with(base, tmp_path / "hf", max_position_embeddings=10**9)
    p = limited(["from-hf", folder, "--out", tmp_path / "run"], gigabytes=2.0)
    assert p.returncode == 0, p.stderr
    p = limited(["sample", tmp_path / "run", "--prompt", "To be", "--chars", "5"],
                gigabytes=2.0)
    assert p.returncode == 0 and p.stdout.startswith("To be"), p.stderr
    (tmp_path / "text.txt").write_text(TEXT)
    p = limited(["train", "--init", tmp_path / "run", "--out",  # 2 heads: not the preset's 4
                 tmp_path / "tuned", "--steps",
                 "1", "--seq-len", "8", "--batch-size", "2", "--eval-batches", "1", "--text",
                 tmp_path / "text.txt", "--threads", "1", "--no-progress", "--sample-chars",
                 "5"], gigabytes=2.0)
    assert p.returncode == 0 and "sample:" in p.stdout, p.stderr


@pytest.mark.parametrize("what, value", [
    ("padding", {"strategy": {"Fixed": 2**40}, "direction": "Right", "pad_to_multiple_of": None,
                 "pad_id": 0, "pad_type_id": 0, "pad_token": "<s>"}),
    ("truncation", {"direction": "Right", "max_length": 3, "strategy": "LongestFirst",
                    "stride": 0}),
])
def test_padding_and_truncation_are_switched_off_with_a_line(base, tmp_path, what, value):
    folder = copy_of(base, tmp_path / "hf")
    spec = json.loads((folder / "tokenizer.json").read_text())
    (folder / "tokenizer.json").write_text(json.dumps({**spec, what: value}))
    p = limited(["from-hf", folder, "--out", tmp_path / "run"])
    assert p.returncode == 0 and f"tokenizer.json's {what} is switched off" in p.stdout, p.stderr
    p = limited(["sample", tmp_path / "run", "--prompt", TEXT[:60], "--chars", "3"])
    assert p.returncode == 0 and p.stdout.startswith(TEXT[:60]), p.stderr


@pytest.mark.parametrize("depth", [100, 100_000])
def test_deep_nesting_is_one_line_in_every_json_file(base, tmp_path, depth):
    for name in ("config.json", "tokenizer.json"):
        folder = copy_of(base, tmp_path / name / "hf")
        (folder / name).write_text("[" * depth + "]" * depth)
        p = limited(["from-hf", folder, "--out", tmp_path / name / "run"])
        assert p.returncode == 1 and "levels deep" in p.stderr, p.stderr
        assert len(p.stderr.strip().splitlines()) == 1


# -- the bounded reader itself ------------------------------------------------------------------


@fuzz(200)
@given(value=VALUES)
def test_nesting_is_what_json_nests(value):
    def depth(v: object) -> int:
        if isinstance(v, (list, dict)):
            inner = v.values() if isinstance(v, dict) else v
            return 1 + max((depth(x) for x in inner), default=0)
        return 0

    raw = json.dumps(value, ensure_ascii=False).encode()
    assert nesting(raw) == depth(value)
    assert parse_json(raw, "x") == json.loads(raw)


@fuzz(200)
@given(raw=st.binary(max_size=200) | st.text(alphabet='[]{}"\\,:1 a', max_size=300).map(
    str.encode))
def test_the_bounded_reader_raises_one_value_error_or_parses(raw):
    try:
        parse_json(raw, "'f'", max_depth=8)
    except ValueError as e:
        assert str(e).startswith("'f' ") and "\n" not in str(e)


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json", "model.safetensors",
                                  "model.safetensors.index.json"])
@pytest.mark.parametrize("kind", ["zeros", "fifo", "folder"])
def test_special_files_in_place_of_any_file_are_one_line(base, tmp_path, name, kind):
    """An endless device, a pipe nobody writes and a folder, in place of each file: no hang."""
    folder = copy_of(base, tmp_path / "hf")
    if name.endswith("index.json"):
        folder = _sharded(base, tmp_path / "sharded")
    target = folder / name
    target.unlink()
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "folder":
        target.mkdir()
    else:
        target.symlink_to("/dev/zero")
    p = limited(["from-hf", folder, "--out", tmp_path / "run"], gigabytes=2.0, seconds=60)
    assert p.returncode == 1 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert not (tmp_path / "run").exists()


def test_a_header_past_the_cap_is_refused_before_it_is_parsed(base, tmp_path):
    """Many tiny tensors: 17 MB of header would be gigabytes of Python objects."""
    one = '"t{}":{{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}'
    header = ("{" + ",".join(one.format(i) for i in range(300_000)) + "}").encode()
    assert len(header) > 16 * 2**20
    folder = copy_of(base, tmp_path / "hf")
    (folder / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header)
    rc, out, err, peak = cli(["from-hf", folder, "--out", tmp_path / "run"])
    assert rc == 1 and "more than the 16,777,216 this reader accepts" in err, err
    assert peak < 3 * len(header) and not (tmp_path / "run").exists()


@pytest.mark.parametrize("dtype", ["I32", "I8", "U8", "BOOL"])
def test_weights_that_are_not_floats_are_refused_by_name(base, tmp_path, dtype):
    from xenith_edu.model.hf import read_safetensors

    tensors = read_safetensors(base / "model.safetensors")
    name = sorted(tensors)[0]
    t = tensors[name]
    header = {k: {"dtype": "F32", "shape": list(a.shape)} for k, a in tensors.items()}
    header[name]["dtype"] = dtype
    size = {"I32": 4, "I8": 1, "U8": 1, "BOOL": 1}[dtype]
    at, body = 0, b""
    for k in sorted(header):
        raw = (np.zeros(t.shape, f"<i{size}").tobytes() if k == name
               else tensors[k].astype("<f4").tobytes())
        header[k]["data_offsets"] = [at, at + len(raw)]
        at, body = at + len(raw), body + raw
    head = json.dumps(header).encode()
    folder = copy_of(base, tmp_path / "hf")
    (folder / "model.safetensors").write_bytes(len(head).to_bytes(8, "little") + head + body)
    rc, _, err, _ = cli(["from-hf", folder, "--out", tmp_path / "run"])
    assert rc == 1 and f"'{name}' holds {dtype}, not floating-point" in err, err


def test_a_tokenizer_regex_that_gives_up_is_one_line_in_sample(base, tmp_path):
    """A normalizer whose regex backtracks past Oniguruma's limit: the library panics in Rust,
    which prints a backtrace on descriptor 2 before Python sees the error."""
    folder = copy_of(base, tmp_path / "hf")
    spec = json.loads((folder / "tokenizer.json").read_text())
    spec["normalizer"] = {"type": "Replace", "pattern": {"Regex": "(a+)+$"}, "content": "x"}
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    assert limited(["from-hf", folder, "--out", tmp_path / "run"]).returncode == 0
    p = limited(["sample", tmp_path / "run", "--prompt", "a" * 40 + "b", "--chars", "2"])
    assert p.returncode == 1 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "retry-limit" in p.stderr


# -- the rules after the gates ------------------------------------------------------------------


@fuzz(30)
@given(prompt=st.text(alphabet="To be,ntqus\n", min_size=1, max_size=12),
       n=st.integers(0, 20), context=st.integers(1, 40), seed=st.integers(0, 3))
def test_capping_the_context_by_what_is_used_draws_the_same_tokens(base, prompt, n, context,
                                                                   seed):
    from xenith_edu.cli.hf import sample_config
    from xenith_edu.model.generate import sample_text

    tok = BPETokenizer.from_file(base / "tokenizer.json")
    cfg = Config(vocab_size=tok.vocab_size + 3, n_embd=16, n_head=2, n_kv_head=1, n_layer=1,
                 ffn_hidden=32, seq_len=context)
    params = random_params(cfg, np.random.default_rng(seed), dtype=np.float32)
    capped = sample_config(cfg, tok, prompt, n)
    assert capped.seq_len <= min(cfg.seq_len, len(tok.encode(prompt)) + n)
    assert (sample_text(params, capped, tok, prompt, n, seed=seed)
            == sample_text(params, cfg, tok, prompt, n, seed=seed))


def test_ids_past_the_tokenizer_decode_as_the_replacement_character(base):
    tok = BPETokenizer.from_file(base / "tokenizer.json")
    ids = tok.encode("To be, or not")
    V = tok.vocab_size
    assert tok.decode([*ids, V, V + 7, *ids]) == "To be, or not\ufffd\ufffdTo be, or not"
    with pytest.raises(ValueError, match=">= 0"):
        tok.decode([-1])
