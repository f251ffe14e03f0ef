"""The command line: `xenith-edu train | sample | gradcheck | student | grade`.

Bad input prints one line saying what is wrong and what to do, and exits non-zero.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

PROG = "xenith-edu"


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (what is wrong, where to read more)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _number(convert: type, least: float, strict: bool, what: str):
    """An argparse type: `convert` the text and require it above (or at) `least`."""

    def parse(s: str):
        try:
            n = convert(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got '{s}'") from None
        if not (least < n < float("inf") if strict else least <= n):
            raise argparse.ArgumentTypeError(f"must be {what}, got {s}")
        return n

    return parse


_positive_int = _number(int, 0, True, "a positive integer (1 or more)")
_nonneg_int = _number(int, 0, False, "an integer >= 0")
_positive_float = _number(float, 0.0, True, "a positive number")


def build_parser() -> argparse.ArgumentParser:
    """The parser of every subcommand, with the help text of every option."""
    from .train import PRESETS

    parser = _Parser(prog=PROG, description="Train, sample and check the tiny LLaMA-style "
                     "transformer of the xenith-edu book, in NumPy on the CPU.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("train", help="train a character-level model on a text file",
                       description="Train a model. By default: the book recipe (4 layers, "
                       "width 128, context 64, 2000 steps of AdamW) on the shipped Shakespeare. "
                       "Writes ckpt.npz, log.jsonl and loss.png into --out.")
    p.add_argument("--preset", choices=sorted(PRESETS), default=None,
                   help="settings to start from: 'book' (the default, a few minutes) or "
                   "'small' (2 layers, width 64, a few seconds). With --resume, only checked "
                   "against the checkpoint's model")
    p.add_argument("--text", metavar="FILE", default=None,
                   help="UTF-8 text file to train on (default: the shipped Shakespeare, or the "
                   "checkpoint's text with --resume)")
    p.add_argument("--steps", type=_positive_int, default=None, metavar="N",
                   help="total number of updates (default: the preset's, 2000 for book); with "
                   "--resume, the total to reach, counting the steps already done")
    p.add_argument("--decay-steps", type=_nonneg_int, default=None, metavar="N",
                   help="step at which the cosine learning-rate decay reaches its minimum "
                   "(default: the preset's; it does not follow --steps, so a run stopped early "
                   "and resumed matches a single run)")
    p.add_argument("--eval-every", type=_positive_int, default=None, metavar="N",
                   help="evaluate on the fixed validation batches and save a checkpoint every "
                   "N steps (default: the preset's, 250 for book)")
    p.add_argument("--seed", type=_nonneg_int, default=None, metavar="S",
                   help="seed of the initial weights and of the training batches (default 1337)")
    p.add_argument("--out", metavar="DIR", default=None,
                   help="run directory (default: runs/<preset>, or the checkpoint's directory "
                   "with --resume)")
    p.add_argument("--resume", metavar="CKPT", default=None,
                   help="continue from this checkpoint (a ckpt.npz or its run directory), "
                   "exactly where it stopped")
    p.add_argument("--overwrite", action="store_true",
                   help="allow a new run to replace the run already in --out")
    p.add_argument("--sample-chars", type=_nonneg_int, default=200, metavar="N",
                   help="characters to sample from the trained model at the end (default 200; "
                   "0 for none)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar (lines at each evaluation instead)")
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser("sample", help="generate text from a checkpoint",
                       description="Generate text from a trained model. The context is cropped "
                       "to the model's last seq_len characters.")
    p.add_argument("checkpoint", metavar="CKPT",
                   help="checkpoint file (ckpt.npz) or the run directory holding it")
    p.add_argument("--prompt", default=None,
                   help="text to continue; every character must be in the model's vocabulary "
                   "(default: a newline)")
    p.add_argument("--chars", type=_nonneg_int, default=500, metavar="N",
                   help="number of characters to generate (default 500)")
    p.add_argument("--temperature", type=_positive_float, default=0.8, metavar="T",
                   help="divide the logits by T: below 1 is more conservative, above 1 more "
                   "adventurous (default 0.8)")
    p.add_argument("--top-k", type=_positive_int, default=None, metavar="K",
                   help="sample only among the K most likely characters (default: all)")
    p.add_argument("--seed", type=_nonneg_int, default=0, metavar="S",
                   help="seed of the sampling generator: same seed, same text (default 0)")
    p.set_defaults(func=_cmd_sample)

    p = sub.add_parser("gradcheck", help="check the whole model's gradients numerically",
                       description="Compare every parameter's analytic gradient with central "
                       "finite differences, in float64 on a tiny random model, and print the "
                       "worst relative error per parameter. Exits 1 if any fails.")
    p.add_argument("--coords", type=_positive_int, default=8, metavar="N",
                   help="random coordinates checked per parameter (default 8)")
    p.add_argument("--seed", type=_nonneg_int, default=0, metavar="S",
                   help="seed of the weights, tokens and coordinates (default 0)")
    p.add_argument("--untied", action="store_true",
                   help="check the model with a separate output projection (lm_head)")
    p.set_defaults(func=_cmd_gradcheck)

    p = sub.add_parser("student", help="make student versions of the chapter notebooks",
                       description="Copy notebooks with the solutions removed and outputs "
                       "cleared.")
    p.add_argument("src", metavar="SRC", help="a notebook or a directory of notebooks")
    p.add_argument("--out", metavar="DIR", required=True,
                   help="directory for the student versions")
    p.set_defaults(func=_cmd_student)

    p = sub.add_parser("grade", help="grade a directory of submitted notebooks",
                       description="Run every submitted notebook and write one row of exercise "
                       "results per submission.")
    p.add_argument("submissions", metavar="DIR", help="directory of submitted notebooks")
    p.add_argument("--out", metavar="CSV", required=True, help="CSV file of grades to write")
    p.add_argument("--timeout", type=_positive_float, default=None, metavar="S",
                   help="seconds allowed per notebook (default: the grader's)")
    p.set_defaults(func=_cmd_grade)
    return parser


def _default_prompt(vocab: str) -> str:
    """A newline, the natural start of a text, if the vocabulary has one."""
    return "\n" if "\n" in vocab else vocab[0]


def _cmd_train(args: argparse.Namespace) -> int:
    from .checkpoint import config_mismatch, load_checkpoint
    from .perf import keep_freed_memory
    from .sample import sample_text
    from .train import PRESETS, TrainConfig, train

    keep_freed_memory()  # no page faults on the step's arrays (see xenith_edu/perf.py)

    if args.resume is not None:
        ckpt = load_checkpoint(args.resume)
        tc = TrainConfig.from_dict(ckpt.train)
        if args.preset is not None:
            want = PRESETS[args.preset].model_config(ckpt.config.vocab_size)
            if want != ckpt.config:
                raise ValueError(f"checkpoint '{args.resume}' is from another model config than "
                                 f"--preset {args.preset} ({config_mismatch(ckpt.config, want)})"
                                 ": drop --preset to resume it, or start a new run with --out")
        if args.seed is not None and args.seed != tc.seed:
            raise ValueError(f"--seed {args.seed} differs from the checkpoint's seed {tc.seed}: "
                             "a resumed run keeps its seed; drop --seed")
        if args.steps is None and ckpt.step >= tc.steps:
            raise ValueError(f"checkpoint '{args.resume}' finished its {tc.steps} steps: pass "
                             f"--steps greater than {ckpt.step} to train further")
        if args.steps is not None and args.steps <= ckpt.step:
            raise ValueError(f"checkpoint '{args.resume}' is already at step {ckpt.step}: pass "
                             f"--steps greater than {ckpt.step} to train further")
        resume_path = Path(args.resume)
        out = args.out or (resume_path if resume_path.is_dir() else resume_path.parent)
    else:
        preset = args.preset or "book"
        tc = PRESETS[preset]
        if args.seed is not None:
            tc = replace(tc, seed=args.seed)
        out = args.out or str(Path("runs") / preset)
    if args.text is not None:
        tc = replace(tc, text=str(Path(args.text).resolve()))
    if args.steps is not None:
        tc = replace(tc, steps=args.steps)
    if args.decay_steps is not None:
        tc = replace(tc, decay_steps=args.decay_steps)
    if args.eval_every is not None:
        tc = replace(tc, eval_every=args.eval_every)

    result = train(tc, out, resume=args.resume, overwrite=args.overwrite,
                   progress=False if args.no_progress else None)
    print(f"final validation loss {result.val_loss:.4f} (training {result.train_loss:.4f}) "
          f"after {result.step} steps; {result.ms_per_step:.1f} ms per step; "
          f"{result.seconds:.0f} s in all")
    if args.sample_chars:
        print("sample:")
        print(sample_text(result.params, result.config, result.tokenizer,
                          _default_prompt(result.tokenizer.vocab),
                          args.sample_chars, temperature=0.8, seed=0))
    return 0


def _cmd_sample(args: argparse.Namespace) -> int:
    from .checkpoint import load_checkpoint
    from .data import CharTokenizer
    from .sample import sample_text

    ckpt = load_checkpoint(args.checkpoint)
    prompt = _default_prompt(ckpt.vocab) if args.prompt is None else args.prompt
    text = sample_text(ckpt.params, ckpt.config, CharTokenizer(ckpt.vocab), prompt,
                       args.chars, temperature=args.temperature, top_k=args.top_k,
                       seed=args.seed)
    print(text)
    return 0


def _cmd_gradcheck(args: argparse.Namespace) -> int:
    from .gradcheck import check_model
    from .model import Config, init_params

    # a tiny model, so finite differences are quick: 2 layers, 2 heads of width 8
    cfg = Config(vocab_size=13, n_embd=16, n_head=2, n_layer=2, ffn_hidden=24, seq_len=6,
                 tie_embeddings=not args.untied)
    params = init_params(cfg, args.seed, np.float64)
    rng = np.random.default_rng(args.seed)
    # non-degenerate: gains away from one, weights larger than init so every path matters
    for k, p in params.items():
        params[k] = p + 0.1 * rng.standard_normal(p.shape) if k.startswith("rms") else p * 10
    x = rng.integers(0, cfg.vocab_size, size=(3, cfg.seq_len))  # (B, S)
    y = rng.integers(0, cfg.vocab_size, size=(3, cfg.seq_len))  # (B, S)
    results = check_model(params, cfg, x, y, n_coords=args.coords, seed=args.seed)
    print(f"whole-model gradient check ({'untied' if args.untied else 'tied'} embeddings, "
          f"float64, {args.coords} coordinates per parameter)")
    print(f"{'parameter':<10} {'worst rel. error':>16}  pass")
    for r in results:
        print(f"{r.name:<10} {r.max_rel_error:>16.1e}  {'yes' if r.passed else 'NO'}")
    failed = [r.name for r in results if not r.passed]
    tol = results[0].tol if results else float("nan")
    if failed:
        print(f"{len(failed)} of {len(results)} parameters fail (tolerance {tol:.0e}): "
              f"{', '.join(failed)}")
        return 1
    print(f"all {len(results)} parameters pass (tolerance {tol:.0e})")
    return 0


def _cmd_student(args: argparse.Namespace) -> int:
    from . import classroom  # written separately; imported only when asked for

    written = classroom.make_student_versions(Path(args.src), Path(args.out)) or []
    print(f"wrote {len(written)} student notebook(s) into {args.out}")
    return 0


def _cmd_grade(args: argparse.Namespace) -> int:
    from . import classroom  # written separately; imported only when asked for

    rows = classroom.grade(Path(args.submissions), Path(args.out), args.timeout) or []
    passed = sum(1 for r in rows if r.get("status") == "passed")
    print(f"wrote {len(rows)} grade row(s), {passed} passed, to {args.out}")
    return 0


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def main(argv: list[str] | None = None) -> int:
    """Run the command line on `argv` (default sys.argv[1:]); return the exit status."""
    from .train import TrainingDiverged

    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help (0) or a usage error, already printed on one line (2)
        return int(e.code or 0)
    try:
        return args.func(args)
    except (ValueError, OSError, TrainingDiverged) as e:
        print(f"{PROG} {args.command}: error: {_one_line(e)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG} {args.command}: interrupted; the last checkpoint (if any) is intact",
              file=sys.stderr)
        return 130
