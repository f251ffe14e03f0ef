"""The chapter registry: one row per chapter of the book, keyed by its slug.
Numbers are never typed: a chapter's number is its place in this table, which `_toc.yml` follows.

Everything that names a chapter (docstrings, exercise tables, the book's generated tables, the
tests) reads it from here. Adding a chapter is one row here, one line in `_toc.yml`, the notebook,
and (if it has any) its module and its exercise module: see CONTRIBUTING.md.
"""

from __future__ import annotations

from typing import NamedTuple


class Chapter(NamedTuple):
    """One chapter: its slug, title, notebook, the package modules it derives, its exercises."""

    slug: str  # the key: also the notebook's file name and the exercise module's name
    title: str  # as the book shows it, without a number
    modules: tuple[str, ...]  # the xenith_edu modules whose functions the chapter derives
    summary: str = ""  # what the reader derives, for the book's generated tables (required)
    numbered: bool = True  # False for the chapter of rules that comes before the first one
    going_further: bool = False  # past the main path (after training): read in any order

    @property
    def notebook(self) -> str:
        """The notebook's path from the repository root, without .ipynb, as `_toc.yml` names it."""
        return f"notebooks/{self.slug}"

    @property
    def exercises(self) -> str:
        """The module that holds this chapter's exercise checks."""
        return f"xenith_edu.exercises.{self.slug}"


# The book's order: the main path follows the gradient backward through the model, assembles it
# and trains it; the going-further chapters come after it, every one of them.
CHAPTERS: tuple[Chapter, ...] = (
    Chapter("rules", "The rules of backprop", (),
            "vector-Jacobian products and the duality table that every chapter uses",
            numbered=False),
    Chapter("softmax_ce", "Softmax cross-entropy", ("softmax_ce",),
            "the gradient of the mean cross-entropy with respect to the logits"),
    Chapter("swiglu", "SwiGLU", ("swiglu",),
            "the gradients through a gated SiLU and three matrix products"),
    Chapter("rmsnorm", "RMSNorm", ("rmsnorm",),
            "the gradient of a root-mean-square normalization and of its gain"),
    Chapter("attention", "Causal attention", ("attention",),
            "the gradients of queries, keys and values through a masked softmax"),
    Chapter("rope", "RoPE", ("rope",),
            "the backward of a rotation: the rotation by the opposite angle"),
    Chapter("embedding", "Embedding scatter-add", ("embedding",),
            "a scatter-add of rows, and the tied embedding's two gradients"),
    Chapter("backward", "The whole backward pass", ("model", "linear", "tools.gradcheck"),
            "the backward pass of the complete model, layer by layer"),
    Chapter("training", "Training the model",
            ("training.data", "training.optim", "training.loop", "model.generate"),
            "AdamW, the learning-rate schedule and the training loop"),
    Chapter("capstone", "Capstone: a whole layer, step by step", (),
            "the backward pass of one whole LLaMA layer, as 45 gradients of 36 atomic steps"),
    Chapter("memory", "Memory: attention without the S×S matrix", ("flash_attention",),
            "attention's backward from the saved log-sum-exp, recomputation, the KV cache",
            going_further=True),
    Chapter("parallel", "Many processes", ("training.parallel",),
            "data-parallel training: the gradient of a mean as the mean of its shards'",
            going_further=True),
    Chapter("torch", "Your backward inside PyTorch", (),
            "our backward as autograd Functions, checked against PyTorch's own gradients",
            going_further=True),
    Chapter("llama", "A real LLaMA", ("model.hf", "training.finetune", "qk_norm", "bias",
                                      "rope_scaling", "geglu", "lora"),
            "grouped-query attention's backward, Hugging Face checkpoints, fine-tuning them; the "
            "open models' pieces (QK-norm, biases, Llama 3's RoPE, windows, GeGLU); LoRA",
            going_further=True),
)

_BY_SLUG = {c.slug: c for c in CHAPTERS}


def chapter(slug: str) -> Chapter:
    """The registry row of chapter `slug`; ValueError naming the known slugs otherwise."""
    try:
        return _BY_SLUG[slug]
    except (KeyError, TypeError):
        raise ValueError(f"no chapter {slug!r}; the chapters are {sorted(_BY_SLUG)}") from None


def number(slug: str) -> int:
    """The chapter's number in the book: 0 for an unnumbered chapter, else its place from 1."""
    c = chapter(slug)
    if not c.numbered:
        return 0
    return 1 + [x.slug for x in CHAPTERS if x.numbered].index(slug)
