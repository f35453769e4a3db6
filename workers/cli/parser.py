"""How launch.py's flags are parsed: one-line answers to bad input (a close match for a typo),
help that shows each default, and the reference implementation's key=value style."""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Sequence
from typing import NoReturn

from agent.envs import name_task

_KEY_VALUE = re.compile(r"([A-Za-z_][A-Za-z0-9_-]*)=(.*)", re.DOTALL)
_TRUE, _FALSE = {"true", "yes", "on", "1"}, {"false", "no", "off", "0"}


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the epilog's line breaks; adds a flag's default to its help when the help does not
    say it already and there is one worth saying (not None or False: those mean 'not given')."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            not action.option_strings
            or "default" in text
            or default is None
            or default is False
            or default == ""
            or default == argparse.SUPPRESS
        ):
            return text
        return text + " (default: %(default)s)"


class CliParser(argparse.ArgumentParser):
    """argparse that answers bad input in one line (a did-you-mean for a mistyped flag) and also
    takes the reference implementation's `key=value` style: `model_size=5` is `--model-size 5`."""

    def __init__(self, **kwargs) -> None:
        # No prefix matching: `--step` is a typo to point out, not an abbreviation to guess at.
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(**kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message}\n")

    def parse_args(self, args: Sequence[str] | None = None, namespace=None) -> argparse.Namespace:
        argv = translate_key_values(self, sys.argv[1:] if args is None else list(args))
        parsed, extra = self.parse_known_args(argv, namespace)
        if extra:
            self.error(_unknown_argument(self, extra[0]))
        if getattr(parsed, "task", None):
            name_task(parsed.task)  # a person named it: its module may be imported
        return parsed

    def long_flags(self) -> list[str]:
        return [flag for flag in self._option_string_actions if flag.startswith("--")]


def _unknown_argument(parser: CliParser, token: str) -> str:
    if token in ("bench", "montage"):
        return (
            f"{token} is a command of its own, the first argument: launch.py {token} ... "
            f"(see launch.py {token} --help)"
        )
    if not token.startswith("-"):
        return f"unexpected argument {token!r} (flags start with --, or write key=value)"
    flag = token.split("=", 1)[0]
    close = difflib.get_close_matches(flag, parser.long_flags(), n=1)
    hint = f"did you mean {close[0]}?" if close else f"see {parser.prog} --help"
    return f"unknown flag {flag} ({hint})"


def translate_key_values(parser: CliParser, argv: list[str]) -> list[str]:
    """`key=value` arguments as the flags they stand for (underscores or dashes in the key;
    true/false for switches); an unknown key is refused with a did-you-mean."""
    actions = parser._option_string_actions
    out: list[str] = []
    value_next = False  # the previous flag takes a value: this token is it, whatever it holds
    for token in argv:
        match = None if value_next else _KEY_VALUE.fullmatch(token)
        if match is None:
            out.append(token)
            action = None if value_next else actions.get(token)
            value_next = action is not None and action.nargs != 0
            continue
        key, value = match.groups()
        flag = "--" + key.replace("_", "-")
        action = actions.get(flag)
        if action is None or isinstance(action, argparse._HelpAction):
            keys = [f[2:] for f in parser.long_flags() if f != "--help"]
            close = difflib.get_close_matches(key.replace("_", "-"), keys, n=1)
            if close and "-" not in key:  # answer in the writer's style: model_size
                close = [close[0].replace("-", "_")]
            hint = f"did you mean {close[0]}?" if close else f"see {parser.prog} --help"
            parser.error(f"unknown key {key} ({hint})")
        if action.nargs != 0:
            out.append(f"{flag}={value}")
            continue
        word = value.strip().lower()
        if word not in _TRUE | _FALSE:
            parser.error(f"{key} is a switch: write {key}=true or {key}=false, not {value!r}")
        on = word in _TRUE
        if isinstance(action, argparse.BooleanOptionalAction):
            out.append(flag if on else next(f for f in action.option_strings if f != flag))
        elif on:
            out.append(flag)  # a store_true flag; false is its default: nothing to add
    return out
