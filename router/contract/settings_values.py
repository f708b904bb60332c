"""Settings as values: a config with sections made or changed from flat names, the flat names of a
config, and a setting's value from its environment variable (the declarations: settings.py)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

from kvroute.router.contract.settings import SECTION, Declared, Section, declared_fields


def build(cls: type, **values: Any) -> Any:
    """`cls` from flat names, each section taking its own (TypeError for a name no field takes)."""
    kwargs, unused = _split(cls, values, None)
    _no_unused(cls, unused)
    return cls(**kwargs)


def replace(config: Any, **values: Any) -> Any:
    """`config` with the settings named (flat names, as `build`) changed."""
    kwargs, unused = _split(type(config), values, config)
    _no_unused(type(config), unused)
    return dataclasses.replace(config, **kwargs)


def _split(cls: type, values: Mapping[str, Any], base: Any) -> tuple[dict[str, Any], set[str]]:
    """The keyword arguments of `cls` (or of `base` replaced) from flat `values`; the names left unused."""
    unused = set(values)
    kwargs = {}
    for f in dataclasses.fields(cls):
        sec = f.metadata.get(SECTION)
        if sec is not None and f.name not in values:
            names = _names(sec) & values.keys()
            if names:
                part = getattr(base, f.name) if base is not None else sec.default()
                kwargs[f.name] = replace(part, **{n: values[n] for n in names})
                unused -= names
        elif f.name in values:
            kwargs[f.name] = values[f.name]
            unused.discard(f.name)
    return kwargs, unused


@functools.cache
def _names(sec: Section) -> frozenset[str]:
    return frozenset(d.field for d in _all_fields(sec.cls) if sec.only is None or d.field in sec.only)


def _no_unused(cls: type, unused: set[str]) -> None:
    if unused:
        raise TypeError(f"{cls.__name__} has no setting {sorted(unused)[0]!r}")


def pick(cls: type, values: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of `values` that name settings of `cls` or of its sections."""
    names = {d.field for d in _all_fields(cls)}
    return {k: v for k, v in values.items() if k in names}


def _all_fields(cls: type) -> list[Declared]:
    out = list(declared_fields(cls))
    for f in dataclasses.fields(cls):
        if SECTION in f.metadata:
            out += _all_fields(f.metadata[SECTION].cls)
    return out


def env_value(d: Declared, env_prefix: str, environ: Mapping[str, str]) -> tuple[bool, Any]:
    """(True, value) from the first of the setting's environment variables that is set, else (False, None).
    A repeated setting's variable holds its items separated by spaces."""
    for var in d.env_names(env_prefix):
        raw = environ.get(var, "")
        if not raw:
            continue
        try:
            value = tuple(d.convert(item) for item in raw.split()) if d.repeat else d.convert(raw)
            d.check(value)
        except ValueError as e:
            raise ValueError(f"${var}: {e}") from None
        return True, value
    return False, None
