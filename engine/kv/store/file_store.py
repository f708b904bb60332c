"""`file:///dir` store: one file per block, `dir/{namespace}/{hh}/{hash:016x}.kv` (hh: its first 2 hex digits).

Meant for a local NVMe or a shared mount. A writer writes a temporary file next to
the final name and renames it into place (atomic on POSIX), so a reader sees the
whole block or no file. Each call runs in one worker thread for the whole batch.
Nothing is ever deleted here: prune the directory (e.g. by access time) to bound it;
a removed file is simply a miss.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import Sequence
from pathlib import Path

_tmp_ids = itertools.count()


class FileStore:
    def __init__(self, root: str | Path, namespace: str, store_id: str) -> None:
        self.store_id = store_id
        self.root = Path(root) / namespace
        self._made: set[Path] = set()

    def path(self, h: int) -> Path:
        name = f"{h:016x}"
        return self.root / name[:2] / f"{name}.kv"

    async def put_many(self, items: Sequence[tuple[int, bytes]]) -> None:
        await asyncio.to_thread(self._put_all, list(items))

    async def get_many(self, hashes: Sequence[int]) -> list[bytes | None]:
        return await asyncio.to_thread(self._get_all, list(hashes))

    async def contains_many(self, hashes: Sequence[int]) -> list[bool]:
        return await asyncio.to_thread(lambda: [self.path(h).exists() for h in hashes])

    async def close(self) -> None:
        pass

    def _put_all(self, items: list[tuple[int, bytes]]) -> None:
        for h, value in items:
            final = self.path(h)
            if final.parent not in self._made:
                final.parent.mkdir(parents=True, exist_ok=True)
                self._made.add(final.parent)
            tmp = final.with_name(f".{final.name}.{os.getpid()}.{next(_tmp_ids)}.tmp")
            try:
                self._write(tmp, value)
            except FileNotFoundError:  # the directory was pruned meanwhile: make it again
                final.parent.mkdir(parents=True, exist_ok=True)
                self._write(tmp, value)
            os.replace(tmp, final)

    @staticmethod
    def _write(path: Path, value: bytes) -> None:
        with open(path, "wb") as f:
            f.write(value)

    def _get_all(self, hashes: list[int]) -> list[bytes | None]:
        out: list[bytes | None] = []
        for h in hashes:
            try:
                with open(self.path(h), "rb") as f:
                    out.append(f.read())
            except FileNotFoundError:
                out.append(None)
        return out


def check_dir(path: str) -> None:
    """Raise with the reason unless `path` is an existing directory this process can write."""
    p = Path(path)
    if not p.is_dir():
        raise OSError(f"{path} is not an existing directory")
    if not os.access(p, os.W_OK | os.X_OK):
        raise OSError(f"{path} is not writable by this process")
