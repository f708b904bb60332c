"""The flags table of a command's docs page, written from its declared settings.

The table sits between two markers on the page; `python -m kvroute.scripts.flags_doc` rewrites it
and `--check` (and tests/unit/test_settings.py) fails when a page is out of date.
"""

from __future__ import annotations

from kvroute.router.contract.cli_parser import Command
from kvroute.router.contract.settings import Declared

BEGIN = "<!-- flags: {prog} (written by `python -m kvroute.scripts.flags_doc` from the settings; do not edit) -->"
END = "<!-- end of flags: {prog} -->"


def flags_table(command: Command) -> str:
    rows = ["| flag | environment | default | allowed | what |", "|---|---|---|---|---|"]
    rows += [_row(d, command.env_prefix) for d in command.settings()]
    return "\n".join(rows)


def _row(d: Declared, env_prefix: str) -> str:
    choices = d.choices()
    allowed = ", ".join(choices) if choices else d.setting.check.text if d.setting.check else ""
    flags = ", ".join(f"`{f}`" for f in d.flags)
    env = ", ".join(f"`{v}`" for v in d.env_names(env_prefix))
    cells = (flags, env, _cell(d.default_text()), _cell(allowed), _cell(d.setting.help))
    return "| " + " | ".join(cells) + " |"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def with_table(page: str, command: Command) -> str:
    """`page` with its table for `command` rewritten; ValueError when the markers are missing."""
    begin, end = BEGIN.format(prog=command.prog), END.format(prog=command.prog)
    head, found, rest = page.partition(begin)
    _, found_end, tail = rest.partition(end)
    if not found or not found_end:
        raise ValueError(f"{command.doc} has no flags markers for {command.prog}: add the lines\n{begin}\n{end}")
    return f"{head}{begin}\n{flags_table(command)}\n{end}{tail}"
