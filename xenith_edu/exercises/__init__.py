"""Exercise checks: one `check_*` function per exercise of the book, called from the notebooks.

The floor is laid out as: `types` (`Spec`, `Case`, `CheckResult`, `Status`), `outcomes` (the one
runner of a learner's function and its in-place rule, shared with the grader's sandbox worker),
`validate` (the shape, dtype and type of what came back), `fit` (a wrong answer explained in the
reference's own terms), `changes` and `mutate` (a wrong answer named as one change of the
reference, found among its mutants), `hints` (a question, the rule, the line, one at a time:
`hint(id)`), `progress` (the learner's record: passed, attempts, hints), `engine` (judging and
diagnosing, the grade log), and one module per chapter, named by the chapter's slug in
`xenith_edu.chapters`.
Each chapter module defines `SPECS` (a list of `Spec`) and one `check_<id>(fn)` per spec, listed
in its `__all__`; this package imports them by name below, and gathers `SPECS` (id -> Spec) and
`CHECKS` (id -> (chapter slug, check function)) in the registry's order.

To add a chapter's exercises: write `xenith_edu/exercises/<slug>.py` with its `SPECS` and its
`check_*` functions, and import them here (a test holds this list to the modules' `__all__`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from ..chapters import CHAPTERS
from .attention import (
    check_attention_backward,
    check_attention_cache_bytes,
    check_attention_find_the_bug,
    check_gqa_backward,
)
from .backward import (
    check_attention_crossover,
    check_backward_find_the_bug,
    check_linear_backward,
    check_residual_scale_backward,
)
from .capstone import check_capstone_layer
from .embedding import (
    check_embedding_backward,
    check_position_embedding_backward,
    check_tied_wte_grad,
)
from .engine import GRADE_LOG_ENV, check, judge
from .hints import forget_hints, hint
from .llama import check_lora_backward, check_padded_cross_entropy, check_qk_norm_backward
from .memory import (
    check_kv_cache_budget,
    check_softmax_merge,
    check_softmax_rowsum,
)
from .outcomes import InPlace, NotCallable, Opaque, Raised, run
from .parallel import (
    check_global_gradient,
    check_ring_allreduce_bytes,
)
from .rmsnorm import (
    check_layernorm_backward,
    check_rmsnorm_backward,
    check_rmsnorm_scale_grad,
)
from .rope import (
    check_rope_backward,
    check_rope_freq_grad,
    check_rope_half_backward,
    check_rope_permutation,
)
from .rules import check_broadcast_backward, check_rules_block
from .softmax_ce import (
    check_label_smoothing,
    check_softmax_cross_entropy,
)
from .swiglu import (
    check_gelu_mlp_backward,
    check_silu_grad,
    check_swiglu_backward,
)
from .torch import check_alibi_slopes_grad, check_attention_bias_backward
from .training import (
    check_adam_l2_update,
    check_adamw_update,
    check_lr_schedule,
)
from .types import Case, CheckResult, Spec, Status

SPECS: dict[str, Spec] = {}
CHECKS: dict[str, tuple[str, Callable[[Callable], CheckResult]]] = {}


def _collect() -> None:
    """Gathers each registered chapter's specs and checks, in the registry's order."""
    for chapter in CHAPTERS:
        try:
            module = importlib.import_module(chapter.exercises)
        except ModuleNotFoundError as e:
            if e.name != chapter.exercises:
                raise
            continue  # a chapter without exercises
        for spec in module.SPECS:
            if spec.id in SPECS:
                raise ValueError(f"exercise id {spec.id!r} is defined twice")
            if spec.chapter != chapter.slug:
                raise ValueError(f"exercise {spec.id!r} is in the {chapter.slug} module but "
                                 f"its cases come from {spec.chapter}")
            SPECS[spec.id] = spec
            CHECKS[spec.id] = (chapter.slug, getattr(module, f"check_{spec.id}"))


_collect()

__all__ = [
    "CHECKS", "SPECS", "GRADE_LOG_ENV", "Case", "CheckResult", "InPlace", "NotCallable", "Opaque",
    "Raised", "Spec", "Status", "check", "forget_hints", "hint", "judge", "run",
    "check_broadcast_backward",
    "check_rules_block",
    "check_softmax_cross_entropy",
    "check_label_smoothing",
    "check_swiglu_backward",
    "check_silu_grad",
    "check_gelu_mlp_backward",
    "check_rmsnorm_backward",
    "check_layernorm_backward",
    "check_rmsnorm_scale_grad",
    "check_attention_backward",
    "check_attention_cache_bytes",
    "check_gqa_backward",
    "check_attention_find_the_bug",
    "check_rope_backward",
    "check_rope_freq_grad",
    "check_rope_half_backward",
    "check_rope_permutation",
    "check_embedding_backward",
    "check_tied_wte_grad",
    "check_position_embedding_backward",
    "check_linear_backward",
    "check_residual_scale_backward",
    "check_backward_find_the_bug",
    "check_attention_crossover",
    "check_kv_cache_budget",
    "check_softmax_merge",
    "check_softmax_rowsum",
    "check_adamw_update",
    "check_lr_schedule",
    "check_adam_l2_update",
    "check_capstone_layer",
    "check_global_gradient",
    "check_ring_allreduce_bytes",
    "check_attention_bias_backward",
    "check_alibi_slopes_grad",
    "check_padded_cross_entropy",
    "check_qk_norm_backward",
    "check_lora_backward",
]
