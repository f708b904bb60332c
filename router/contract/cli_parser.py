"""Every `kvroute` command's parser, made from its declared settings (settings.py).

`Command(prog=..., env_prefix="KVROUTE_ROUTER_", sections=(RouterConfig, LogConfig))` gives
`parser()`: one flag per declared setting, with its type, choices and help ending in its default,
grouped by section. `parse_args` returns every declared name resolved: the flag given, else its
environment variable, else the default. A mistake prints a short usage line and one line saying
what is wrong, with "did you mean --X?" for a near-miss flag or choice, and exits 2; a value outside
its range, one line alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

from kvroute.router.contract.cli_help import HelpFormatter
from kvroute.router.contract.settings import Declared, declared, did_you_mean
from kvroute.router.contract.settings_values import env_value

Section = type | Callable[[], list[Declared]]  # a settings dataclass, or what lists settings made elsewhere
GIVEN = "given_settings"  # parsed flags: the names a flag or an environment variable set (not defaults)


def given(args: argparse.Namespace) -> frozenset[str]:
    """The settings of parsed `args` that a flag or an environment variable set."""
    return getattr(args, GIVEN)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Command:
    prog: str  # "kvroute router"
    description: str
    env_prefix: str  # "KVROUTE_ROUTER_"
    sections: tuple[Section, ...]
    doc: str = ""  # the docs page holding the flags table ("docs/router.md"), "" for none
    epilog: str = ""

    def settings(self) -> list[Declared]:
        out: list[Declared] = []
        for s in self.sections:
            out += declared(s) if isinstance(s, type) else s()
        return out

    def parser(self, environ: Mapping[str, str] | None = None) -> SettingsParser:
        env = os.environ if environ is None else environ
        return SettingsParser(self, env)


class SettingsParser(argparse.ArgumentParser):
    def __init__(self, command: Command, environ: Mapping[str, str]) -> None:
        settings = command.settings()
        example = f" ({settings[0].flag}: {settings[0].env_names(command.env_prefix)[0]})" if settings else ""
        env_line = (f"Every flag may also be set by an environment variable, {command.env_prefix}<FLAG>{example}; "
                    "a flag given wins over it, and it over the default.")
        super().__init__(prog=command.prog, description=command.description, formatter_class=HelpFormatter,
                         epilog="\n".join(filter(None, (command.epilog, env_line))))
        self.command = command
        self.environ = environ
        self.settings = settings
        groups: dict[str, argparse._ArgumentGroup] = {}
        for d in self.settings:
            group = groups.get(d.group) or groups.setdefault(d.group, self.add_argument_group(d.group or None))
            group.add_argument(*d.flags, dest=d.name, default=argparse.SUPPRESS, help=help_line(d), **_action(d))

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> argparse.Namespace:  # type: ignore[override]
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            near = did_you_mean(extras[0].split("=")[0], self._option_string_actions) if extras[0][:1] == "-" else ""
            self.error(f"unrecognized arguments: {' '.join(extras)}{near}")
        given = set()
        for d in self.settings:
            try:
                if hasattr(parsed, d.name):
                    value = getattr(parsed, d.name)
                    setattr(parsed, d.name, tuple(value) if d.repeat else value)
                    d.check(getattr(parsed, d.name))
                    given.add(d.name)
                    continue
                found, value = env_value(d, self.command.env_prefix, self.environ)
            except ValueError as e:  # a value out of its range: what is wrong, without the usage
                self.exit(2, f"{self.prog}: {e}\n")
            if not found and d.default is dataclasses.MISSING:
                self.error(f"{d.flag} is required")
            setattr(parsed, d.name, value if found else d.default)
            given.update([d.name] if found else [])
        setattr(parsed, GIVEN, frozenset(given))
        return parsed

    def short_usage(self) -> str:
        required = " ".join(f"{d.flag} {_metavar(d)}" for d in self.settings if d.default is dataclasses.MISSING)
        return f"usage: {self.prog} {required + ' ' if required else ''}[options]  ({self.prog} --help lists them)"

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.short_usage()}\n{self.prog}: {message}\n")

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        if action.choices is not None and value not in action.choices:
            raise argparse.ArgumentError(action, f"invalid choice {value!r}{did_you_mean(str(value), action.choices)}; "
                                                 f"choose from {', '.join(map(str, action.choices))}")


def help_line(d: Declared) -> str:
    rule = d.setting.check.text if d.setting.check is not None else ""
    tail = f"default: {d.default_text()}" + (f"; {rule}" if rule else "")
    return f"{d.setting.help} ({tail})".replace("%", "%%")


def _metavar(d: Declared) -> str:
    return d.setting.metavar or d.flag[2:].upper().replace("-", "_")


def _action(d: Declared) -> dict[str, Any]:
    if d.kind is bool and not d.repeat:
        return {"action": argparse.BooleanOptionalAction if d.default is True else "store_true"}
    choices = d.choices()
    kw: dict[str, Any] = {"type": _typed(d), "choices": choices}
    if choices is None:
        kw["metavar"] = _metavar(d)
    elif d.setting.metavar:
        kw["metavar"] = d.setting.metavar
    if d.repeat:
        kw["action"] = "append"
        if d.setting.many:
            kw.update(action="extend", nargs="+")
    return kw


def _typed(d: Declared) -> Callable[[str], Any]:
    """`d.convert` for argparse: its ValueError becomes argparse's one-line message."""
    def convert(text: str) -> Any:
        try:
            return d.convert(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e).removeprefix(d.flag + " ")) from None

    convert.__name__ = d.kind.__name__
    return convert
