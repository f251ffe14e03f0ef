"""The training settings: `TrainConfig`, which nests the model's `Config`, and the presets.
Every setting, the model's and the run's, is a command-line option; see the training chapter.

The book recipe is nanoGPT's CPU recipe for character-level Shakespeare, on our model.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import numpy as np

from ..model import Config
from ..model.adapters import LoraSpec

VOCAB_FROM_TEXT = 1  # TrainConfig.model's vocab_size: the run's text sets it (model_config)
PARALLEL = ("processes", "threads")  # TrainConfig.parallel: how the workers of a batch run


def setting(default: Any, group: str, help: str) -> Any:
    """A TrainConfig field with its group and its help text, which the command line shows."""
    return field(default=default, metadata={"group": group, "help": help})


# The help text of the model's settings (the fields of Config but vocab_size). A field of
# Config missing here is still an option, with a plain help text (see `model_help`).
MODEL_HELP = {
    "n_layer": "transformer layers",
    "n_head": "attention heads per layer (must divide n_embd)",
    "n_embd": "width d of the residual stream",
    "ffn_hidden": "hidden width of SwiGLU (unless set: LLaMA's rule, 8 d / 3 rounded up to a "
                  "multiple of 32)",
    "seq_len": "context length: positions per training window",
    "tie_embeddings": "use the embedding table as output layer",
    "rope_theta": "RoPE base of the rotation frequencies",
    "norm_eps": "epsilon inside RMSNorm's square root",
    "n_kv_head": "key/value heads per layer (grouped-query attention; unless set: n_head)",
    "attention": "attention kernel: plain, or flash (blockwise, no S x S matrix; see the memory "
                 "chapter)",
    "flash_block": "block size of flash attention",
    "head_width": "each head's width, when it is not n_embd / n_head (Qwen3's heads are wider)",
    "qkv_bias": "biases on the query, key and value projections (Qwen2.5)",
    "qk_norm": "an RMSNorm over each head of the queries and keys, before RoPE (Qwen3)",
    "rope_scaling": "RoPE frequencies: none, or llama3 (Llama 3.1's rule for a longer context)",
    "sliding_window": "each position attends to this many positions, itself included "
                      "(Mistral); unless set: all earlier ones",
}


# the model's fields that no run setting sets: the text's, the tokenizer's special tokens, the
# Hugging Face family a checkpoint was read from (for to-hf), and the numbers of Llama 3's RoPE
# scaling (a checkpoint's: `--rope-scaling llama3` takes Llama 3.1's), the layers without RoPE,
# and Gemma 3's pieces (a checkpoint's architecture, read by from-hf)
NOT_SETTINGS = ("vocab_size", "pad_token_id", "bos_token_id", "eos_token_id", "family",
                "nope_layers", "activation", "norm_plus_one", "post_norms", "scale_embeddings",
                "query_pre_attn_scalar", "global_layers", "local_rope_theta",
                "rope_factor", "rope_low_freq_factor", "rope_high_freq_factor",
                "rope_original_context")


def model_fields() -> list:
    """The fields of Config that are settings of a run: all but vocab_size (from the text) and
    pad_token_id (from a checkpoint's tokenizer, see the chapter "A real LLaMA")."""
    return [f for f in fields(Config) if f.name not in NOT_SETTINGS]


def model_help(name: str) -> str:
    """The help text of the model's setting `name`."""
    return MODEL_HELP.get(name, f"the model's {name} (see Config)")


def _book_model() -> Config:
    return Config(vocab_size=VOCAB_FROM_TEXT, n_embd=128, n_head=4, n_layer=4, seq_len=64)


@dataclass(frozen=True)
class TrainConfig:
    """Everything a run is made of: the model's Config, data, optimizer and loop settings.

    Every setting is a command-line option (`--n-layer 6`, or `--set n_layer=6`), the model's
    as the run's; `tc.n_layer` reads `tc.model.n_layer`. Change settings by name, model or run
    alike, with `tc.with_settings(n_embd=256, lr=3e-4)`.
    """

    model: Config = field(default_factory=_book_model, metadata={"group": "model"})
    recompute: bool = setting(False, "model", "keep only each layer's input and recompute its "
                              "forward during the backward (same gradients, less memory)")
    text: str | None = setting(None, "data", "UTF-8 text file to train on")
    batch_size: int = setting(12, "data", "windows per step (the global batch over all ranks)")
    lr: float = setting(1e-3, "optimizer", "peak learning rate, reached after the warmup")
    min_lr: float = setting(1e-4, "optimizer", "learning rate at the end of the cosine decay")
    beta1: float = setting(0.9, "optimizer", "AdamW decay rate of the first moment")
    beta2: float = setting(0.99, "optimizer", "AdamW decay rate of the second moment")
    eps: float = setting(1e-8, "optimizer", "AdamW epsilon, added to sqrt(v_hat)")
    weight_decay: float = setting(0.1, "optimizer", "decoupled weight decay of the matrices")
    warmup_steps: int = setting(100, "optimizer", "steps of linear learning-rate warmup")
    decay_steps: int = setting(2000, "optimizer", "step at which the decay reaches min_lr "
                               "(it does not follow steps, so a resumed run matches one run)")
    grad_clip: float = setting(1.0, "optimizer", "clip the gradients to this global norm")
    steps: int = setting(2000, "loop", "total number of updates (with --resume: the total "
                         "to reach, counting the steps already done)")
    eval_every: int = setting(250, "loop", "evaluate and save a checkpoint every N steps")
    eval_batches: int = setting(200, "loop", "batches of fixed windows per evaluation")
    seed: int = setting(1337, "loop", "seed of the initial weights and of the batches")
    threads: int = setting(2, "loop", "workers that share each batch, one BLAS thread each (1: "
                           "one worker, BLAS threads the products); under mpiexec each rank is "
                           "one worker")
    parallel: str = setting("processes", "loop", "how those workers run: processes (an "
                            "interpreter each, no lock between them: the faster) or threads (of "
                            "one interpreter); the same numbers either way")
    lora_rank: int = setting(0, "fine-tuning", "LoRA: the rank of the adapters that train while "
                             "the --init model stays frozen (0: full fine-tuning)")
    lora_alpha: float = setting(16.0, "fine-tuning", "LoRA: each adapter's output is scaled by "
                                "lora_alpha / lora_rank (peft's rule)")
    lora_targets: str = setting("q,v", "fine-tuning", "LoRA: the projections that get an "
                                "adapter, among q,k,v,o (comma-separated)")

    def __post_init__(self) -> None:
        if not isinstance(self.model, Config):
            raise TypeError(f"model must be a Config, got {type(self.model).__name__}")
        if self.parallel not in PARALLEL:
            raise ValueError(f"parallel must be one of {', '.join(PARALLEL)}, "
                             f"got {self.parallel!r}")
        if not isinstance(self.recompute, (bool, np.bool_)):
            raise TypeError(f"recompute must be true or false, got {self.recompute!r}")
        if self.text is not None and not isinstance(self.text, str):
            raise TypeError(f"text must be a file name, got {self.text!r}")
        for name in ("batch_size", "steps", "eval_every", "eval_batches", "threads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        for name in ("warmup_steps", "decay_steps", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        for name in ("lr", "min_lr", "beta1", "beta2", "eps", "weight_decay", "grad_clip"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
                raise TypeError(f"{name} must be a number, got {value!r}")
        if not 0 < self.lr < math.inf:
            raise ValueError(f"lr must be positive, got {self.lr}")
        if not 0 <= self.min_lr <= self.lr:
            raise ValueError(f"min_lr must lie in [0, lr = {self.lr}], got {self.min_lr}")
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"{name} must lie in [0, 1), got {getattr(self, name)}")
        if not self.eps > 0:
            raise ValueError(f"eps must be positive, got {self.eps}")
        if not self.weight_decay >= 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if not self.grad_clip > 0:
            raise ValueError(f"grad_clip must be positive, got {self.grad_clip}")
        r = self.lora_rank
        if isinstance(r, bool) or not isinstance(r, (int, np.integer)) or r < 0:
            raise ValueError(f"lora_rank must be an integer >= 0, got {r!r}")
        if not isinstance(self.lora_targets, str):
            raise TypeError(f"lora_targets must be names joined by commas, got "
                            f"{self.lora_targets!r}")
        self.lora_spec(check=True)

    def lora_spec(self, check: bool = False) -> LoraSpec | None:
        """The run's LoRA adapters (None: full fine-tuning); with `check`, the alpha and the
        targets are checked even at rank 0, so that a bad value is refused when it is given."""
        names = tuple(t.strip() for t in self.lora_targets.split(",") if t.strip())
        if self.lora_rank == 0:
            if check:
                LoraSpec(1, self.lora_alpha, names)
            return None
        return LoraSpec(int(self.lora_rank), self.lora_alpha, names)

    def __getattr__(self, name: str) -> Any:
        # called only for names that are not fields: the model's sizes read as the recipe's
        if name != "model" and name in {f.name for f in model_fields()}:
            return getattr(self.model, name)
        raise AttributeError(f"'TrainConfig' has no setting {name!r}")

    def model_config(self, vocab_size: int) -> Config:
        """The model's Config for a vocabulary of `vocab_size` characters."""
        return replace(self.model, vocab_size=vocab_size)

    def with_settings(self, **given: Any) -> TrainConfig:
        """This recipe with the settings `given` by name, the model's and the run's alike.

        A model size that defaults from others (ffn_hidden from n_embd, by LLaMA's rule) keeps
        following them unless it is given: `with_settings(n_embd=256)` gets the hidden width of
        width 256. Raises ValueError or TypeError naming a bad value, ValueError an unknown name.
        """
        names = {f.name for f in model_fields()}
        unknown = sorted(set(given) - names - {f.name for f in fields(self)} - {"model"})
        if unknown:
            raise ValueError(f"unknown training settings {unknown}")
        sizes = {k: given.pop(k) for k in list(given) if k in names}
        if sizes:
            for f in model_fields():  # a size that followed its rule follows it still
                if f.default is None and f.name not in sizes and _follows_rule(self.model, f.name):
                    sizes[f.name] = None
            given["model"] = replace(self.model, **sizes)
        return replace(self, **given)

    def to_dict(self) -> dict[str, Any]:
        """Every setting by name, the model's first (vocab_size is the text's): what a log and a
        checkpoint record, and `from_dict` reads back."""
        d = asdict(self)
        model = d.pop("model")
        for name in NOT_SETTINGS:  # the text's and the tokenizer's, not the run's settings
            model.pop(name)
        return {**model, **d}

    @classmethod
    def from_dict(cls, d: dict) -> TrainConfig:
        """The inverse of `to_dict`, with a clear error for unknown settings.

        Settings added since a run was made take their defaults.
        """
        if not isinstance(d, dict):
            raise TypeError(f"training settings must be a record, got {type(d).__name__}")
        return cls().with_settings(**d)


def _follows_rule(model: Config, name: str) -> bool:
    """Whether the model's `name`, a size that defaults from others, has its default value (not
    when its default is no model: a head width given because n_embd / n_head is odd)."""
    blank: dict[str, Any] = {name: None}  # a field named at run time: None, its default rule
    try:
        return getattr(model, name) == getattr(replace(model, **blank), name)
    except (ValueError, TypeError):
        return False


# The book recipe: nanoGPT's CPU recipe for char-level Shakespeare, on our model.
BOOK = TrainConfig()
# A run of a few seconds, for tests, demos and the golden loss curve; in one thread, so that
# it is bit for bit the training chapter's own loop and the baseline of the data-parallel runs.
SMALL = BOOK.with_settings(n_layer=2, n_head=4, n_embd=64, seq_len=32, batch_size=16, lr=3e-3,
                           min_lr=3e-4, warmup_steps=20, decay_steps=200, steps=200,
                           eval_every=50, eval_batches=16, threads=1)
PRESETS = {"book": BOOK, "small": SMALL}
