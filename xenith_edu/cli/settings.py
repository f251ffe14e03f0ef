"""The training settings on the command line: one option per setting of `TrainConfig` and of
the model's `Config` it nests, made from the two dataclasses, and `--set name=value`, checked.

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
from ..training import PRESETS, TrainConfig
from ..training.checkpoint import read_meta
from ..training.config import model_fields, model_help


class UsageError(ValueError):
    """A setting the command line cannot use: unknown name, bad value, given twice."""


def _settings() -> list[tuple[str, str, str]]:
    """(name, group, help) of every setting: the model's (Config but vocab_size), then the run's."""
    model = [(f.name, "model", model_help(f.name)) for f in model_fields()]
    return model + [(f.name, f.metadata["group"], f.metadata["help"]) for f in fields(TrainConfig)
                    if f.name != "model"]


def _kinds() -> dict[str, type]:
    """Each setting's kind: int, float, bool, str, or Path for an optional file name."""
    hints = {**typing.get_type_hints(Config), **typing.get_type_hints(TrainConfig)}
    kinds = {}
    for name, _, _ in _settings():
        hint = hints[name]
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
    """One option per setting (`--n-layer`, `--lr`, ...), in groups, with its help."""
    kinds, groups = _kinds(), {}
    for name, group, text in _settings():
        if group not in groups:
            groups[group] = p.add_argument_group(f"{group} settings")
        values = {n: _show(getattr(tc, name)) for n, tc in PRESETS.items()}
        shown = (f"default {values['book']}" if len(set(values.values())) == 1 else
                 ", ".join(f"{n}: {x}" for n, x in values.items()))
        help = f"{text} ({shown})"
        flag, kind = "--" + name.replace("_", "-"), kinds[name]
        if kind is bool:
            groups[group].add_argument(flag, dest=f"set_{name}", default=None, help=help,
                                       action=argparse.BooleanOptionalAction)
        else:
            metavar = {int: "N", float: "X", Path: "FILE", str: "NAME"}[kind]
            groups[group].add_argument(flag, dest=f"set_{name}", default=None, help=help,
                                       type=_argtype(name, kind), metavar=metavar)


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


def build(base: TrainConfig, given: dict[str, Any]) -> TrainConfig:
    """`base` with the settings `given`; UsageError naming a bad value."""
    try:
        return base.with_settings(**given)
    except (ValueError, TypeError) as e:
        raise UsageError(str(e)) from None


def train_config(args: argparse.Namespace) -> tuple[TrainConfig, str | Path]:
    """The TrainConfig and the run directory of `xenith-edu train` with these arguments.

    With --resume: the checkpoint's settings, then --preset's model, then the options; whether
    they can continue that run is the trainer's one resume check (`runlog.check_resume`).
    """
    given = overrides(args)
    if args.resume is None:
        preset = args.preset or "book"
        return build(PRESETS[preset], given), args.out or str(Path("runs") / preset)
    base = _saved_settings(args.resume)
    if args.preset is not None:
        base = base.with_settings(model=PRESETS[args.preset].model)
    resume = Path(args.resume)
    return build(base, given), args.out or (resume if resume.is_dir() else resume.parent)


def init_train_config(args: argparse.Namespace, model: Config,
                      arch: tuple[str, ...]) -> TrainConfig:
    """The settings of `train --init`: --preset's run settings on the checkpoint's `model`, whose
    architecture (the fields `arch`) no option changes; an option that repeats the checkpoint's
    value is accepted, one that differs is a UsageError naming it."""
    given = overrides(args)
    differ = [f"--{n.replace('_', '-')} ({given[n]} asked, the checkpoint has "
              f"{getattr(model, n)})" for n in arch if n in given and given[n] != getattr(model, n)]
    if differ:
        raise UsageError(f"--init takes the model from the checkpoint: drop {', '.join(differ)}")
    preset = PRESETS[args.preset or "book"]
    base = replace(preset, model=replace(preset.model, **{n: getattr(model, n) for n in arch}))
    return build(base, {k: v for k, v in given.items() if k not in arch})


def _saved_settings(resume: str) -> TrainConfig:
    """The settings a checkpoint was trained with; ValueError naming the file if unreadable."""
    train = read_meta(resume)["train"]  # the metadata alone: the trainer reads the arrays once
    try:
        return TrainConfig.from_dict(train)
    except (ValueError, TypeError) as e:
        raise ValueError(f"checkpoint '{resume}' has training settings this version cannot read "
                         f"({e}): start a new run with --out") from None


__all__ = ["UsageError", "add_arguments", "build", "convert", "init_train_config", "overrides",
           "train_config"]
