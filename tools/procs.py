"""Helpers shared by the benchmark tools: start kvroute processes, wait for them to serve."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import aiohttp


def spawn(args: list[str], env: dict | None = None) -> subprocess.Popen:
    """`python -m <args>` with its output discarded (the tools print their own figures)."""
    return subprocess.Popen([sys.executable, "-m", *args], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


async def wait_ready(session: aiohttp.ClientSession, url: str, path: str = "/health", tries: int = 300) -> None:
    for _ in range(tries):
        try:
            async with session.get(url + path) as r:
                if r.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.1)
    raise SystemExit(f"{url} did not come up")


def write_json(path: str | None, result) -> None:
    """Write a tool's result to --out (nothing without one)."""
    if path:
        with open(path, "w") as f:
            json.dump(result, f, indent=2)
