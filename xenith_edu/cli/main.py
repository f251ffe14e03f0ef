"""The command line: `xenith-edu train | sample | gradcheck | from-hf | to-hf | student | grade`.

Bad input prints one line saying what is wrong and what to do, and exits non-zero.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np

from .. import __version__
from ..tools.util import Terminated, one_line, sigterm_raises
from . import hf, settings

PROG = "xenith-edu"
CHAPTERS_DIR = "xenith-edu-chapters"  # where `chapters` and `lab` write, by default


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (what is wrong, where to read more)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see {self.prog} --help)\n")


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
    parser = _Parser(prog=PROG, description="Train, sample and check the tiny LLaMA-style "
                     "transformer of the xenith-edu book, in NumPy on the CPU.")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_train(sub)
    _add_others(sub)
    hf.add_parsers(sub)
    _add_teaching(sub)
    _add_chapters(sub)
    _add_course_tools(sub)
    _add_progress(sub)
    return parser


def _add_chapters(sub: argparse._SubParsersAction) -> None:
    help_out = ("folder for the student notebooks (default: %(default)s); the notebooks "
                "already there are your work and are kept, missing chapters are added")
    p = sub.add_parser("chapters", help="write the book's chapters, as student notebooks",
                       description="Write the student version of every chapter of the book "
                       "(solutions replaced by stubs) from the installed package into a folder. "
                       "What the chapters read is package data: they run from any folder.")
    p.add_argument("--out", metavar="DIR", default=CHAPTERS_DIR, help=help_out)
    p.set_defaults(func=_cmd_chapters)
    p = sub.add_parser("lab", help="open the student notebooks of the chapters in JupyterLab",
                       description="Write the student notebooks as `chapters` does, then open "
                       "JupyterLab on that folder (the lab extra: pip install "
                       "\"xenith-edu[lab]\").")
    p.add_argument("--out", metavar="DIR", default=CHAPTERS_DIR, help=help_out)
    p.add_argument("--allow-root", action="store_true",
                   help="let JupyterLab run as root (in a container)")
    p.set_defaults(func=_cmd_lab)


def _add_course_tools(sub: argparse._SubParsersAction) -> None:
    """`grade-stats` (the class's statistics) and `gradescope` (an autograder archive)."""
    p = sub.add_parser("grade-stats", help="the class's statistics and what to re-teach, from "
                       "the CSV that grade wrote", description="Write stats.md, stats.csv, "
                       "mistakes.csv, figures.csv and totals.png from a grades CSV and its "
                       "totals file; absent learners and those on no roster are counted apart.")
    p.add_argument("grades", metavar="CSV", help="the grades CSV that grade wrote")
    p.add_argument("--out", metavar="DIR", required=True, help="folder of the statistics")
    p.add_argument("--totals", metavar="CSV", help="its totals file (default: the one next to "
                   "it, <name>.totals.csv)")
    p.set_defaults(func=_cmd_grade_stats)
    p = sub.add_parser("gradescope", help="write a Gradescope autograder archive",
                       description="Write a zip to upload as a Gradescope autograder: setup.sh, "
                       "run_autograder, the package's wheel and the teacher's notebooks as "
                       "student versions (checks, points, written questions; no solution).")
    p.add_argument("notebooks", metavar="DIR", help="folder of the teacher's notebooks")
    p.add_argument("--out", metavar="ZIP", required=True, help="the archive to write")
    p.add_argument("--chapters", nargs="+", metavar="NAME", help="the notebooks of the "
                   "assignment, by file name without .ipynb (default: every one that checks)")
    p.add_argument("--dist", metavar="FILE", help="the package's wheel or sdist to install "
                   "(default: a wheel of the package installed here)")
    p.add_argument("--extras", nargs="+", metavar="EXTRA", help="the package's extras to "
                   "install too (torch for the PyTorch chapter, hf torch for the LLaMA one)")
    p.add_argument("--wheels", metavar="DIR", help="a folder of the dependencies' wheels to "
                   "carry in the archive (pip download \"xenith-edu[notebooks]\" -d DIR): "
                   "setup.sh installs from them before PyPI, and without PyPI at all")
    p.add_argument("--timeout", type=_positive_float, default=120.0,
                   help="seconds allowed per notebook (default: 120)")
    p.add_argument("--memory", type=_positive_float, metavar="GIB",
                   help="address space of the learner's process, in GiB (default: the grader's)")
    p.add_argument("--visibility", default="visible", choices=("visible", "hidden",
                   "after_due_date", "after_published"), help="when learners see the tests")
    p.set_defaults(func=_cmd_gradescope)


def _cmd_grade_stats(args: argparse.Namespace) -> int:
    from ..gradebook.stats import FILES, write_stats  # only when asked for

    stats = write_stats(Path(args.grades), Path(args.out),
                        None if args.totals is None else Path(args.totals))
    print(f"wrote {', '.join(FILES)} into {args.out}: {len(stats.totals)} learner(s) in the "
          f"class, {len(stats.absent)} absent and {len(stats.off_roster)} not on the roster "
          "counted apart")
    return 0


def _cmd_gradescope(args: argparse.Namespace) -> int:
    from ..gradebook.gradescope import build  # only when asked for

    made = build(Path(args.notebooks), Path(args.out), args.chapters,
                 dist=None if args.dist is None else Path(args.dist), extras=args.extras,
                 wheels=None if args.wheels is None else Path(args.wheels),
                 timeout=args.timeout, visibility=args.visibility,
                 memory=None if args.memory is None else int(args.memory * 2**30))
    parts = made.parts
    auto = sum(sum(p.points.values()) for p in parts)
    written = sum(q.points for p in parts for q in p.questions)
    print(f"wrote {args.out}: {len(parts)} notebook(s), {sum(len(p.points) for p in parts)} "
          f"exercise(s) worth {auto:g} points, {written:g} points of written answers; set "
          f"Gradescope's autograder timeout above {made.seconds:.0f} s")
    return 0


def _add_progress(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("progress", help="print your exercise progress: passed, attempts, hints",
                       description="Print the table the chapters' checks record as you work: "
                       "for each exercise, whether it passed, the attempts and the hints asked "
                       "for.")
    p.add_argument("--file", default=None, metavar="PATH",
                   help="the progress file (default: $XENITH_EDU_PROGRESS, else "
                   "xenith-edu-progress.json in the current folder)")
    p.set_defaults(func=_cmd_progress)


def _cmd_progress(args: argparse.Namespace) -> int:
    from ..exercises import CHECKS, progress  # the exercise registry, only for this command

    file = Path(args.file) if args.file else progress.path()
    if file is None:
        raise ValueError(f"progress is off ({progress.PROGRESS_ENV}=off): nothing is recorded")
    if file.exists() and not file.is_file():
        raise ValueError(f"--file: {file} is not a file")
    if not file.exists():
        print(f"No progress recorded yet in {file}: run a chapter's checks first.")
        return 0
    print(progress.table(progress.read(file), [(c, e) for e, (c, _) in CHECKS.items()]))
    return 0


def _add_train(sub: argparse._SubParsersAction) -> None:
    from ..training import PRESETS  # when the command runs: --help stays fast

    p = sub.add_parser("train", help="train a character-level model on a text file",
                       description="Train a model. By default: the book recipe (4 layers, "
                       "width 128, context 64, 2000 steps of AdamW) on the shipped Shakespeare. "
                       "Writes ckpt.npz, log.jsonl and loss.png into --out. Every setting of the "
                       "recipe is an option below (or --set name=value); an option overrides "
                       "the preset. Under `mpiexec -n K` the K processes train one model, each "
                       "on its share of the batch (see the \"Many processes\" chapter).")
    p.add_argument("--preset", choices=sorted(PRESETS), default=None,
                   help="settings to start from: 'book' (the default, a few minutes) or "
                   "'small' (2 layers, width 64, a few seconds). With --resume, only checked "
                   "against the checkpoint's model")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", dest="settings",
                   help="set a setting by its name: any option of the groups below, with _ "
                   "for -, e.g. --set lr=3e-4 --set tie_embeddings=false (repeatable)")
    p.add_argument("--out", metavar="DIR", default=None,
                   help="run directory (default: runs/<preset>, or the checkpoint's directory "
                   "with --resume)")
    p.add_argument("--resume", metavar="CKPT", default=None,
                   help="continue from this checkpoint (a ckpt.npz or its run directory), "
                   "exactly where it stopped; it keeps its settings unless an option changes "
                   "them (the model and the seed cannot change)")
    p.add_argument("--overwrite", action="store_true",
                   help="allow a new run to replace the run already in --out")
    p.add_argument("--sample-chars", type=_nonneg_int, default=200, metavar="N",
                   help="characters to sample from the trained model at the end (default 200; "
                   "0 for none)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar (lines at each evaluation instead)")
    p.add_argument("--overlap", action="store_true",
                   help="under mpiexec: start each layer's gradient all-reduce during the "
                   "backward pass instead of after it (same results)")
    p.add_argument("--mpi-timeout", type=_positive_float, default=300.0, metavar="S",
                   help="under mpiexec: seconds without progress after which a process decides "
                   "another one has failed, and stops them all (default 300)")
    hf.add_init_argument(p)
    settings.add_arguments(p)
    p.set_defaults(func=_cmd_train)


def _add_others(sub: argparse._SubParsersAction) -> None:
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
    hf.add_run_argument(p)
    p.set_defaults(func=_cmd_gradcheck)


def _add_teaching(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("student", help="make student versions of the chapter notebooks",
                       description="Copy notebooks with the solutions removed and outputs "
                       "cleared.")
    p.add_argument("src", metavar="SRC", help="a notebook or a directory of notebooks")
    p.add_argument("--out", metavar="DIR", required=True,
                   help="directory for the student versions")
    p.set_defaults(func=_cmd_student)

    p = sub.add_parser("grade", help="grade a directory of submitted notebooks",
                       description="Run each learner's notebooks in a sandbox, call their "
                       "exercise functions on hidden cases, judge the answers outside the "
                       "sandbox, and write one row per learner and exercise, with a journal "
                       "(for --resume) and a one-page report next to the CSV.")
    p.add_argument("submissions", metavar="DIR", help="directory of submitted notebooks")
    p.add_argument("--out", metavar="CSV", required=True, help="CSV file of grades to write")
    p.add_argument("--timeout", type=_positive_float, default=None, metavar="S",
                   help="seconds allowed per notebook (default: the grader's)")
    p.add_argument("--instructor", metavar="PATH", default=None,
                   help="the teacher's notebook or folder of notebooks, whose check cells say "
                   "which exercises to grade (default: the book's chapter notebooks)")
    p.add_argument("--jobs", type=_positive_int, default=None, metavar="N",
                   help="learners graded at the same time (default: the number of cores)")
    p.add_argument("--resume", action="store_true",
                   help="keep the learners already in the journal next to --out; grade the rest "
                   "(and the rows whose check changed since)")
    p.add_argument("--regrade", metavar="NAMES", default=None,
                   help="grade these learners again (alice,bob) and keep the others from the "
                   "journal next to --out")
    p.add_argument("--memory", type=_positive_float, default=None, metavar="GIB",
                   help="memory limit of each sandboxed process, in GiB (default 2)")
    p.add_argument("--shard", metavar="K/N", default=None,
                   help="grade only the K-th of N slices of the class (every N-th learner from "
                   "the K-th), writing its journal and facts for grade-merge")
    p.add_argument("--seed", type=_nonneg_int, default=None, metavar="S",
                   help="the assignment's case seed: every learner gets the same hidden cases "
                   "(default: a random one, kept in the journal; give the same to every shard)")
    _add_course_options(p)
    p.set_defaults(func=_cmd_grade)
    _add_grade_merge(sub)


def _add_course_options(p: argparse.ArgumentParser) -> None:
    """The course's options of `grade` and `grade-merge`: roster, deadline, sheets, files."""
    g = p.add_argument_group("the course (points come from the teacher's notebooks)")
    g.add_argument("--roster", metavar="CSV", default=None,
                   help="the class list: a CSV with an id column (the submission's name) and "
                   "optional name, email, section, sis_login, canvas_id")
    g.add_argument("--deadline", metavar="TIME", default=None,
                   help="when the work is due, ISO 8601 (2026-12-01T23:59, local time unless "
                   "an offset is given); the times come from --timestamps, or --late-from-mtime")
    g.add_argument("--timestamps", metavar="CSV", default=None,
                   help="the submission times an LMS exports: a CSV with columns id, submitted "
                   "(the source of lateness)")
    g.add_argument("--late-from-mtime", action="store_true", default=None,
                   help="judge lateness by the files' modification times instead (a learner "
                   "or an archive can set them)")
    g.add_argument("--late-penalty", type=_fraction, default=None, metavar="F",
                   help="the fraction of the points lost per day begun late (0.1 for 10%%)")
    g.add_argument("--late-cutoff", metavar="TIME", default=None,
                   help="after this time (ISO 8601) late work gets no points")
    g.add_argument("--late-rule", choices=["earned", "possible"], default=None,
                   help="what --late-penalty takes a fraction of: the points earned (default), "
                   "or the points possible, capped at the points earned (Canvas's rule)")
    g.add_argument("--extensions", metavar="CSV", default=None,
                   help="each learner's extension: a CSV with columns id, extension (their own "
                   "deadline, ISO 8601, or a number of days); the roster may have the column too")
    g.add_argument("--overrides", metavar="CSV", default=None,
                   help="the teacher's points, which win over the checks: a CSV with columns "
                   "learner, exercise (or question), points, comment")
    g.add_argument("--written", metavar="CSV", default=None,
                   help="the sheet of written answers, with the points and comments filled in")
    g.add_argument("--feedback", metavar="DIR", default=None,
                   help="write one self-contained HTML page of feedback per learner into DIR")
    from ..gradebook.exports import EXPORT_CHOICES  # the LMS files' one table (no NumPy)

    g.add_argument("--export", action="append", choices=EXPORT_CHOICES, default=[],
                   metavar="LMS[:ID]",
                   help="write the gradebook import file of this LMS next to --out, its rows "
                   "matched by one identifier for the whole file (repeatable): "
                   f"{', '.join(EXPORT_CHOICES)}; canvas alone is canvas:id (the roster's id "
                   "as SIS User ID), moodle alone is moodle:email. A learner of the roster "
                   "without the identifier, or two with one, is refused before grading")


def _fraction(s: str) -> float:
    x = _number(float, 0.0, False, "a fraction from 0 to 1")(s)
    if x > 1:
        raise argparse.ArgumentTypeError(f"must be a fraction from 0 to 1, got {s}")
    return x


def _add_grade_merge(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("grade-merge", help="join the shards of a class graded with --shard",
                       description="Join the journals of the shards graded with grade --shard "
                       "K/N into the CSV, totals and report one run of grade writes.")
    p.add_argument("shards", metavar="SHARD_CSV", nargs="+",
                   help="the --out CSV of each shard (its journal and facts are next to it)")
    p.add_argument("--out", metavar="CSV", required=True, help="CSV file of grades to write")
    _add_course_options(p)
    p.set_defaults(func=_cmd_grade_merge)


def _default_prompt(vocab: str) -> str:
    """A newline, the natural start of a text, if the vocabulary has one."""
    return "\n" if "\n" in vocab or not vocab else vocab[0]  # a BPE run has no vocab string


def _cmd_train(args: argparse.Namespace) -> int:
    with sigterm_raises():  # SIGTERM stops the run as Ctrl-C does (only in the main thread)
        return _train(args)


def _train(args: argparse.Namespace) -> int:
    from ..model.generate import sample_text  # when the command runs: --help stays fast
    from ..tools.perf import keep_freed_memory  # when the command runs: --help stays fast
    from ..training import train  # when the command runs: --help stays fast

    keep_freed_memory()  # no page faults on the step's arrays (see xenith_edu/perf.py)
    ranks = _ranks(args.overlap, args.mpi_timeout)

    def run():
        if args.init is not None:  # the model is the checkpoint's, whatever the preset's
            tc, out = hf.fine_tune_config(args)
        else:
            tc, out = settings.train_config(args)
        return train(tc, out, resume=args.resume, overwrite=args.overwrite,
                     progress=False if args.no_progress else None, ranks=ranks, init=args.init)

    result = run() if ranks is None else ranks.run(run, lambda e: _report("train", e), _status)
    if ranks is not None and not ranks.is_root:
        return 0  # only rank 0 writes and prints
    comm = "" if ranks is None else (f" ({len(ranks)} processes; all-reduce "
                                     f"{result.comm_ms_per_step:.1f} ms of it)")
    print(f"final validation loss {result.val_loss:.4f} (training {result.train_loss:.4f}) "
          f"after {result.step} steps; {result.ms_per_step:.1f} ms per step{comm}; "
          f"{result.seconds:.0f} s in all")
    if args.sample_chars:
        print("sample:")
        prompt = _default_prompt(result.tokenizer.vocab)
        cfg = hf.sample_config(result.config, result.tokenizer, prompt, args.sample_chars)
        print(sample_text(result.params, cfg, result.tokenizer, prompt,
                          args.sample_chars, temperature=0.8, seed=0))
    return 0


def _ranks(overlap: bool, timeout: float):
    """The data-parallel ranks when an MPI launcher started us, else None (one process)."""
    from ..training import parallel  # when the command runs: --help stays fast

    if parallel.launched_by_mpi():
        return parallel.DataParallel.from_world(overlap, timeout)
    if parallel.srun_without_mpi():
        raise ValueError("srun started several tasks without MPI: each would train alone and "
                         "write the same run folder; use srun --mpi=pmix (or --mpi=pmi2)")
    if overlap:
        raise settings.UsageError("--overlap applies to a run of several processes: launch "
                                  "it with mpiexec -n K xenith-edu train ...")
    return None


def _cmd_sample(args: argparse.Namespace) -> int:
    from ..model.generate import sample_text  # when the command runs: --help stays fast
    from ..training.checkpoint import load_checkpoint  # when the command runs: --help stays fast

    ckpt = load_checkpoint(args.checkpoint)
    prompt = _default_prompt(ckpt.vocab) if args.prompt is None else args.prompt
    cfg = hf.sample_config(ckpt.config, ckpt.tokenizer(), prompt, args.chars)  # context used

    def show(piece: str) -> None:  # each token as it comes
        sys.stdout.write(piece)
        sys.stdout.flush()

    sample_text(ckpt.params, cfg, ckpt.tokenizer(), prompt, args.chars,
                temperature=args.temperature, top_k=args.top_k, seed=args.seed, on_text=show)
    print()
    return 0


def _cmd_gradcheck(args: argparse.Namespace) -> int:
    from ..model import Config, check_model  # when the command runs: --help stays fast
    from ..model.params import random_params  # when the command runs: --help stays fast

    if args.run is not None:  # a run's own model and weights
        cfg, params, x, y = hf.gradcheck_run(args)
    else:  # a tiny model, so finite differences are quick: 2 layers, 2 heads of width 8
        cfg = Config(vocab_size=13, n_embd=16, n_head=2, n_layer=2, ffn_hidden=24, seq_len=6,
                     tie_embeddings=not args.untied)
        rng = np.random.default_rng(args.seed)
        # non-degenerate: gains away from one, weights larger than init so every path matters
        params = random_params(cfg, rng)
        x = rng.integers(0, cfg.vocab_size, size=(3, cfg.seq_len))  # (B, S)
        y = rng.integers(0, cfg.vocab_size, size=(3, cfg.seq_len))  # (B, S)
    results = check_model(params, cfg, x, y, n_coords=args.coords, seed=args.seed)
    print(f"whole-model gradient check ({'untied' if not cfg.tie_embeddings else 'tied'} "
          f"embeddings, float64, {args.coords} coordinates per parameter)")
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
    from .. import booktools  # written separately; imported only when asked for

    written = booktools.make_student_versions(Path(args.src), Path(args.out)) or []
    print(f"wrote {len(written)} student notebook(s) into {args.out}")
    return 0


def _cmd_chapters(args: argparse.Namespace) -> int:
    from ..booktools.student import write_chapters  # imported only when asked for

    written, kept = write_chapters(args.out)
    print(f"wrote {len(written)} student notebook(s) into {args.out}" + (
        f"; kept the {len(kept)} already there" if kept else ""))
    return 0


def _cmd_lab(args: argparse.Namespace) -> int:
    import importlib.util  # only when asked for
    import subprocess  # only when asked for

    if importlib.util.find_spec("jupyterlab") is None:
        raise ValueError("JupyterLab is not installed: pip install \"xenith-edu[lab]\" (or "
                         f"open the notebooks that `{PROG} chapters` writes in any Jupyter)")
    _cmd_chapters(args)
    command = [sys.executable, "-m", "jupyterlab", *(["--allow-root"] if args.allow_root
                                                      else []), args.out]
    lab = subprocess.Popen(command)
    while True:
        try:
            return lab.wait()
        except KeyboardInterrupt:  # Ctrl-C is JupyterLab's: it asks whether to stop
            continue


def _cmd_grade(args: argparse.Namespace) -> int:
    from .. import gradebook  # written separately; imported only when asked for

    given = {"instructor": args.instructor, "jobs": args.jobs, "resume": args.resume or None,
             "memory": None if args.memory is None else int(args.memory * 2**30),
             "shard": args.shard, "seed": args.seed, "regrade": args.regrade,
             **_course_options(args)}
    rows = gradebook.grade(Path(args.submissions), Path(args.out), args.timeout,
                           **{k: v for k, v in given.items() if v is not None}) or []
    passed = sum(1 for r in rows if r.get("status") == "passed")
    if args.shard:
        print(f"graded shard {args.shard}: {len(rows)} grade row(s), {passed} passed; join the "
              f"shards with {PROG} grade-merge")
        return 0
    print(f"wrote {len(rows)} grade row(s), {passed} passed, to {args.out}")
    return 0


def _course_options(args: argparse.Namespace) -> dict:
    """The course's options as `grade` and `grade_merge` take them (None: not given)."""
    paths = {k: None if getattr(args, k) is None else Path(getattr(args, k))
             for k in ("roster", "timestamps", "written", "feedback", "extensions", "overrides")}
    return {**paths, "deadline": args.deadline, "late_penalty": args.late_penalty,
            "late_cutoff": args.late_cutoff, "export": tuple(args.export) or None,
            "late_from_mtime": args.late_from_mtime, "late_rule": args.late_rule}


def _cmd_grade_merge(args: argparse.Namespace) -> int:
    from .. import gradebook  # written separately; imported only when asked for

    given = {k: v for k, v in _course_options(args).items() if v is not None}
    rows = gradebook.grade_merge([Path(p) for p in args.shards], Path(args.out), **given)
    passed = sum(1 for r in rows if r.get("status") == "passed")
    print(f"joined {len(args.shards)} shard(s): wrote {len(rows)} grade row(s), {passed} "
          f"passed, to {args.out}")
    return 0


def _status(e: BaseException) -> int:
    """The exit status for error `e`: 2 for a usage error (as argparse's), 130 for Ctrl-C,
    143 for SIGTERM (128 + the signal's number, as a shell reports a process it ended)."""
    if isinstance(e, KeyboardInterrupt):
        return 128 + (signal.SIGTERM if isinstance(e, Terminated) else signal.SIGINT)
    return 2 if isinstance(e, settings.UsageError) else 1


def _report(command: str, e: BaseException) -> int:
    """Print the one line of error `e` on stderr; return its exit status."""
    if isinstance(e, KeyboardInterrupt):  # the trainer's message names the checkpoint kept
        kept = one_line(e) if str(e) else "the last checkpoint (if any) is intact"
        how = "stopped by SIGTERM" if isinstance(e, Terminated) else "interrupted"
        print(f"{PROG} {command}: {how}; {kept}", file=sys.stderr)
    else:
        see = f" (see {PROG} {command} --help)" if isinstance(e, settings.UsageError) else ""
        print(f"{PROG} {command}: error: {one_line(e)}{see}", file=sys.stderr)
    return _status(e)


def main(argv: list[str] | None = None) -> int:
    """Run the command line on `argv` (default sys.argv[1:]); return the exit status."""
    from ..training import TrainingDiverged  # when the command runs: --help stays fast

    # when the command runs: --help stays fast
    from ..training.parallel import Stopped, launcher_rank

    parser = build_parser()
    try:
        if launcher_rank() not in (None, 0):  # under mpiexec, rank 0 alone prints usage
            with open(os.devnull, "w") as quiet, redirect_stdout(quiet), redirect_stderr(quiet):
                args = parser.parse_args(argv)
        else:
            args = parser.parse_args(argv)
    except SystemExit as e:  # --help (0) or a usage error, already printed on one line (2)
        return int(e.code or 0)
    try:
        return args.func(args)
    except Stopped as e:  # a data-parallel run stopped; one rank has printed why
        return e.code
    except (ValueError, OSError, ImportError, TrainingDiverged, KeyboardInterrupt) as e:
        # ImportError: a missing extra, named in its one line (booktools/student.py)
        return _report(args.command, e)
