"""Settings declared once: each field of a component's frozen config dataclass carries its type
(the annotation), default, constraint and help (the field's metadata). From that one declaration
come the command's flags and `--help` (cli_parser.py), its environment variables, the checks the
config runs when it is made, and the flags table in the docs (settings_doc.py).

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class ListenConfig:
        port: int = setting(8000, "port to listen on", check=Range(0, 65535))

        def __post_init__(self) -> None:
            check_settings(self)  # then the checks that read two fields

The constraints (Range, POSITIVE, HTTP_URL, ...) are in constraints.py. A field whose value is a
settings dataclass of its own is a section (`section(ConnectionLimits)`): its flags join the
command's, and the component that needs only it is given only it. `build` (settings_values.py)
makes a config with sections from flat names (`build(RouterConfig, port=0, header_timeout_s=5)`).

Per setting, a flag given wins over its environment variable (KVROUTE_<COMMAND>_<FLAG>, e.g.
KVROUTE_ROUTER_PORT), which wins over the default. Dataclasses and not msgspec Structs: configs
are made once at start-up, never on a request path; field metadata, `dataclasses.replace` and
properties are what the components already use, and the messages stay ours.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import types
import typing
from collections.abc import Callable, Iterable
from typing import Any

from kvroute.router.contract.constraints import Check

SETTING = "kvroute.setting"
SECTION = "kvroute.section"
TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Setting:
    help: str
    check: Check | None = None
    choices: tuple[str, ...] | Callable[[], Iterable[str]] | None = None  # a callable: read from a registry late
    flag: str | None = None  # default: the field's name, "_" as "-"
    aliases: tuple[str, ...] = ()  # more flags for it ("--num-requests" beside "--requests")
    metavar: str | None = None
    parse: Callable[[str], Any] | None = None  # one flag's text -> the value (default: the annotated type)
    default_text: str | None = None  # what the default means, where its value does not say it
    env: tuple[str, ...] = ()  # more environment variables, after the command's own
    cli: bool = True  # False: the program sets it (no flag)
    repeat: bool | None = None  # a tuple given one flag per item; None: a tuple without `parse`
    many: bool = False  # a repeated setting whose flag also takes several items (`--lora-modules A=x B=y`)


def setting(default: Any = dataclasses.MISSING, help: str = "", **kw: Any) -> Any:
    """A config field declared with its flag: `port: int = setting(8000, "port to listen on")`."""
    return dataclasses.field(default=default, metadata={SETTING: Setting(help=help, **kw)})


@dataclasses.dataclass(frozen=True)
class Section:
    cls: type
    default: Callable[[], Any]  # the section when no setting of it is given
    only: tuple[str, ...] | None  # its settings that are flags here (None: all)


def section(cls: type, default: Callable[[], Any] | None = None, only: Iterable[str] | None = None) -> Any:
    """A field holding another settings dataclass: `default()` (else `cls()`) with the settings given.
    `only`: the settings of it this config takes (the others keep `default()`'s values)."""
    made = default or cls
    meta = {SECTION: Section(cls, made, tuple(only) if only else None)}
    return dataclasses.field(default_factory=made, metadata=meta)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Declared:
    """One setting as a command sees it: its dest name, scalar type and declaration."""

    name: str  # the attribute in parsed flags (the field's name, after any prefix)
    field: str  # the field's name in `owner`
    owner: type
    kind: type  # int, float, str or bool (one item's, for a repeated flag)
    repeat: bool  # a tuple given one flag per item
    optional: bool  # None is a value
    default: Any  # dataclasses.MISSING: required
    setting: Setting
    group: str = ""  # the section's title in --help and the docs
    prefix: str = ""  # flag prefix ("planner-"), for a section reused under another command

    @property
    def flag(self) -> str:
        return "--" + self.prefix + (self.setting.flag or self.field.replace("_", "-"))

    @property
    def flags(self) -> tuple[str, ...]:
        return (self.flag, *self.setting.aliases)

    def env_names(self, env_prefix: str) -> tuple[str, ...]:
        own = env_prefix + self.flag[2:].upper().replace("-", "_")
        return (own, *self.setting.env)

    def choices(self) -> tuple[str, ...] | None:
        c = self.setting.choices
        return tuple(c() if callable(c) else c) if c is not None else None

    def default_text(self) -> str:
        if self.setting.default_text is not None:
            return self.setting.default_text
        if self.default is dataclasses.MISSING:
            return "required"
        return show(self.default)

    def convert(self, text: str) -> Any:
        """One flag's (or one item's) text as a value; ValueError says what was expected."""
        if self.setting.parse is not None:
            return self.setting.parse(text)
        if self.kind is bool:
            if text.lower() not in TRUE + FALSE:
                raise ValueError(f"{self.flag} takes 1 or 0 (true or false), got {text!r}")
            return text.lower() in TRUE
        try:
            return self.kind(text)
        except ValueError:
            raise ValueError(f"{self.flag} takes {'an integer' if self.kind is int else 'a number'}, "
                             f"got {text!r}") from None

    def check(self, value: Any) -> None:
        if value is None and self.optional or value == self.default:  # the declared default is allowed
            return
        if self.repeat and isinstance(value, str):  # a config made in code: each character would be an item
            raise ValueError(f"{self.flag} takes a tuple of values, got the string {value!r}")
        for item in (value if self.repeat else (value,)):
            choices = self.choices()
            if choices is not None and item not in choices:
                raise ValueError(f"{self.flag} must be one of {', '.join(choices)}, got {item!r}"
                                 f"{did_you_mean(str(item), choices)}")
            problem = self.setting.check.problem(item) if self.setting.check else None
            if problem:
                raise ValueError(f"{self.flag} {problem}, got {item!r}")


def show(value: Any) -> str:
    """A default as --help and the docs write it."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple):
        return ",".join(map(str, value)) if value else "none"
    return repr(value) if value == "" else str(value)


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """' (did you mean X?)' for the candidate closest to `word` (flags compared without their dashes), or ''."""
    names = {c.lstrip("-"): c for c in candidates}
    match = difflib.get_close_matches(word.lstrip("-"), list(names), n=1, cutoff=0.75)
    return f" (did you mean {names[match[0]]}?)" if match else ""


def _kind(hint: Any) -> tuple[type, bool, bool]:
    """(scalar type, repeated, optional) of an annotation: int, str | None, tuple[str, ...]."""
    args = typing.get_args(hint)
    optional = typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args
    if optional:
        hint = next(a for a in args if a is not type(None))
    if typing.get_origin(hint) is tuple:
        return typing.get_args(hint)[0], True, optional
    return hint, False, optional


def declared(cls: type, prefix: str = "", only: Iterable[str] | None = None) -> list[Declared]:
    """The settings of `cls` and of its sections, in declaration order. With `prefix`, flags and
    names carry it (`declared(PlannerConfig, "planner-")`: --planner-interval-s, planner_interval_s)."""
    return list(_declared(cls, prefix, None if only is None else tuple(only)))


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


@functools.cache
def _declared(cls: type, prefix: str, only: tuple[str, ...] | None) -> tuple[Declared, ...]:
    hints = _hints(cls)
    title = (cls.__doc__ or cls.__name__).strip().splitlines()[0].rstrip(".")
    out: list[Declared] = []
    for f in dataclasses.fields(cls):
        if SECTION in f.metadata:
            sec = f.metadata[SECTION]
            base = flat(sec.default())  # its defaults here: the section's own, or those this config gives it
            out += [dataclasses.replace(d, default=base[d.field]) for d in _declared(sec.cls, prefix, sec.only)]
            continue
        s = f.metadata.get(SETTING)
        if s is None or not s.cli or (only is not None and f.name not in only):
            continue
        out.append(_declare(f, hints[f.name], cls, prefix, title))
    return tuple(out)


def flat(config: Any) -> dict[str, Any]:
    """Every field of `config` and of its sections, by name (as `build` takes them; for JSON reports)."""
    out = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        out.update(flat(value) if SECTION in f.metadata else {f.name: value})
    return out


def check_settings(config: object) -> None:
    """Each declared field of `config` against its choices and constraint; ValueError names the flag."""
    for d in declared_fields(type(config)):
        d.check(getattr(config, d.field))


def declared_fields(cls: type) -> list[Declared]:
    """The fields of `cls` itself that carry a setting (flags or not), without its sections."""
    found = _FIELDS.get(cls)
    if found is None:
        hints = _hints(cls)
        found = _FIELDS[cls] = [_declare(f, hints[f.name], cls)
                                for f in dataclasses.fields(cls) if SETTING in f.metadata]
    return found


_FIELDS: dict[type, list[Declared]] = {}


def _declare(f: dataclasses.Field, hint: Any, owner: type, prefix: str = "", group: str = "") -> Declared:
    s = f.metadata[SETTING]
    kind, repeat, optional = _kind(hint)
    if s.repeat is not None:
        repeat = s.repeat
    elif s.parse is not None:
        repeat = False  # one flag parsed into the whole value
    return Declared(name=prefix.replace("-", "_") + f.name, field=f.name, owner=owner, kind=kind, repeat=repeat,
                    optional=optional, default=f.default, setting=s, group=group, prefix=prefix)
