"""The published config.json files the chapter "A real LLaMA" tabulates: the same files the
tests build their tiny folders from, one per family the package reads, each read by from-hf.
"""

from __future__ import annotations

import json

import pytest

from xenith_edu.model.config import Config
from xenith_edu.model.hf import config_from_hf
from xenith_edu.model.hf.layout import FAMILIES
from xenith_edu.tools.shipped import shipped

pytest.importorskip("transformers")  # the tests' families module builds folders with it
import families  # noqa: E402

PUBLISHED = json.loads(shipped("open_models.json").read_text(encoding="utf-8"))
BY_NAME = {"SmolLM-135M": families.SMOLLM_135M, "TinyLlama-1.1B": families.TINYLLAMA,
           **families.NEW}


def test_the_shipped_files_are_the_tests_files() -> None:
    """One file per model: the chapter's copy equals the one the family tests use."""
    assert set(PUBLISHED) == set(BY_NAME)
    for name, entry in PUBLISHED.items():
        assert entry["config"] == BY_NAME[name], name


def test_every_family_the_package_reads_is_in_the_table() -> None:
    assert {e["config"]["model_type"] for e in PUBLISHED.values()} == set(FAMILIES)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_each_file_reads_and_adds_what_its_family_adds(name: str) -> None:
    cfg = config_from_hf(PUBLISHED[name]["config"])
    book = Config(vocab_size=8, n_embd=8, n_head=2, n_layer=1, seq_len=8)
    added = {f for f in ("head_width", "qkv_bias", "qk_norm", "rope_scaling", "sliding_window",
                         "nope_layers", "activation", "norm_plus_one", "post_norms",
                         "scale_embeddings", "global_layers", "local_rope_theta")
             if getattr(cfg, f) != getattr(book, f)}
    expected = {"llama": set(), "qwen2": {"qkv_bias"}, "qwen3": {"head_width", "qk_norm"},
                "mistral": {"sliding_window"}, "smollm3": {"nope_layers"},
                "gemma3_text": {"head_width", "qk_norm", "sliding_window", "activation",
                                "norm_plus_one", "post_norms", "scale_embeddings",
                                "global_layers", "local_rope_theta"}}
    kind = PUBLISHED[name]["config"]["model_type"]
    want = {"rope_scaling"} if name.startswith("Llama-3") else expected[kind]
    assert added == want
