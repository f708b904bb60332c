"""URLs as they may be logged or shown: a password in `redis://user:password@host` never is."""

from __future__ import annotations

import urllib.parse


def redact(url: str | None) -> str | None:
    """`url` with its password replaced by `***` (user, host, port, path kept)."""
    if not url:
        return url
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    netloc = f"{user}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))
