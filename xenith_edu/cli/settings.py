"""The training settings on the command line: one option per `TrainConfig` field, made from the
dataclass itself, and `--set name=value`, checked against it.

An option overrides the preset (or, with --resume, the checkpoint's settings). A wrong name or
value is a `UsageError`: the command line prints it as one line that names the setting.
"""

from __future__ import annotations

import argparse
import difflib
import types
import typing
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from ..model import Config


class UsageError(ValueError):
    """A setting the command line cannot use: unknown name, bad value, given twice."""


def _kinds() -> dict[str, type]:
    """Each TrainConfig field's kind: int, float, bool, str, or Path for an optional file name."""
    from ..training import TrainConfig  # when the options are built

    kinds = {}
    for name, hint in typing.get_type_hints(TrainConfig).items():
        args = set(typing.get_args(hint)) - {type(None)}
        if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
            hint = Path if args == {str} else args.pop()  # str | None: a file, or the default
        kinds[name] = hint
    return kinds


_WORDS = {"int": "an integer", "float": "a number", "bool": "true or false", "Path": "a file name",
          "str": "a word"}
_BOOL = {"true": True, "yes": True, "1": True, "on": True,
         "false": False, "no": False, "0": False, "off": False}


def convert(name: str, kind: type, text: str) -> Any:
    """`text` as a value of setting `name`; ValueError naming the setting and the kind expected."""
    try:
        if kind is bool:
            return _BOOL[text.strip().lower()]
        if kind is Path:
            if not text:
                raise ValueError(text)
            return str(Path(text).resolve())  # a resumed run finds it from any directory
        return kind(text)
    except (ValueError, KeyError):
        raise ValueError(f"{name} expects {_WORDS[kind.__name__]}, got '{text}'") from None


def _argtype(name: str, kind: type):
    def parse(text: str) -> Any:
        try:
            return convert(name, kind, text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return parse


def add_arguments(p: argparse.ArgumentParser) -> None:
    """One option per TrainConfig field (`--n-layer`, `--lr`, ...), in groups, with its help."""
    from ..training import PRESETS, TrainConfig  # when the options are built

    kinds, groups = _kinds(), {}
    for f in fields(TrainConfig):
        group = f.metadata["group"]
        if group not in groups:
            groups[group] = p.add_argument_group(f"{group} settings")
        values = {n: _show(getattr(tc, f.name)) for n, tc in PRESETS.items()}
        shown = (f"default {values['book']}" if len(set(values.values())) == 1 else
                 ", ".join(f"{n}: {x}" for n, x in values.items()))
        help = f"{f.metadata['help']} ({shown})"
        flag, kind = "--" + f.name.replace("_", "-"), kinds[f.name]
        if kind is bool:
            groups[group].add_argument(flag, dest=f"set_{f.name}", default=None, help=help,
                                       action=argparse.BooleanOptionalAction)
        else:
            metavar = {int: "N", float: "X", Path: "FILE", str: "NAME"}[kind]
            groups[group].add_argument(flag, dest=f"set_{f.name}", default=None, help=help,
                                       type=_argtype(f.name, kind), metavar=metavar)


def _show(value: Any) -> str:
    if value is None:
        return "the shipped Shakespeare"
    return str(value).lower() if isinstance(value, bool) else str(value)


def overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The settings the command line gives: each option, and each `--set name=value`."""
    kinds = _kinds()
    given = {n: getattr(args, f"set_{n}") for n in kinds if getattr(args, f"set_{n}") is not None}
    for item in args.settings:
        name, eq, text = item.partition("=")
        name = name.strip().replace("-", "_")
        if not eq:
            raise UsageError(f"--set {item}: expected NAME=VALUE, e.g. --set lr=3e-4")
        if name not in kinds:
            raise UsageError(f"--set {item}: {_unknown(name, list(kinds))}")
        try:
            value = convert(name, kinds[name], text)
        except ValueError as e:
            raise UsageError(f"--set {item}: {e}") from None
        if name in given and given[name] != value:
            raise UsageError(f"{name} is given twice, as {given[name]} and as {value}: give it "
                             "once")
        given[name] = value
    return given


def _unknown(name: str, known: list[str]) -> str:
    if name in {f.name for f in fields(Config)}:
        return f"{name} is not a setting of its own: the vocabulary size comes from the text"
    close = difflib.get_close_matches(name, known, n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    return f"unknown setting '{name}': {hint}the settings are {', '.join(known)}"


def build(base: Any, given: dict[str, Any]) -> Any:
    """`base` (a TrainConfig) with the settings `given`; UsageError naming a bad value."""
    try:
        return replace(base, **given)
    except (ValueError, TypeError) as e:
        raise UsageError(str(e)) from None


def train_config(args: argparse.Namespace) -> tuple[Any, str | Path]:
    """The TrainConfig and the run directory of `xenith-edu train` with these arguments."""
    from ..training import PRESETS, TrainConfig  # when the options are built
    from ..training.checkpoint import config_mismatch, load_checkpoint  # when the options are built

    given = overrides(args)
    if args.resume is None:
        preset = args.preset or "book"
        return build(PRESETS[preset], given), args.out or str(Path("runs") / preset)
    ckpt = load_checkpoint(args.resume)
    base = TrainConfig.from_dict(ckpt.train)
    if args.preset is not None:
        want = PRESETS[args.preset].model_config(ckpt.config.vocab_size)
        if want != ckpt.config:
            raise ValueError(f"checkpoint '{args.resume}' is from another model config than "
                             f"--preset {args.preset} ({config_mismatch(ckpt.config, want)}): "
                             "drop --preset to resume it, or start a new run with --out")
    if given.get("seed", base.seed) != base.seed:
        raise ValueError(f"--seed {given['seed']} differs from the checkpoint's seed {base.seed}: "
                         "a resumed run keeps its seed; drop --seed")
    steps = given.get("steps")
    if steps is None and ckpt.step >= base.steps:
        raise ValueError(f"checkpoint '{args.resume}' finished its {base.steps} steps: pass "
                         f"--steps greater than {ckpt.step} to train further")
    if steps is not None and steps <= ckpt.step:
        raise ValueError(f"checkpoint '{args.resume}' is already at step {ckpt.step}: pass "
                         f"--steps greater than {ckpt.step} to train further")
    resume = Path(args.resume)
    return build(base, given), args.out or (resume if resume.is_dir() else resume.parent)


__all__ = ["UsageError", "add_arguments", "build", "convert", "overrides", "train_config"]
