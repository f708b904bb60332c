"""The help formatter every `kvroute` subcommand uses: each flag's help line ends with its default."""

from __future__ import annotations

import argparse
import textwrap


class HelpFormatter(argparse.HelpFormatter):
    """Appends "(default: X)" unless the help already names it, or there is nothing to name
    (None, False, a suppressed default); keeps the description's line breaks (and wraps longer lines)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "%(default)" in text or "default:" in text or not action.option_strings:
            return text
        if action.default in (None, False, argparse.SUPPRESS) or action.nargs == 0 and action.default is True:
            return text
        return f"{text} (default: %(default)s)"

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return "\n".join(textwrap.fill(line, width, initial_indent=indent, subsequent_indent=indent) or indent
                         for line in text.splitlines())
