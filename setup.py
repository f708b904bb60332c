"""The optional C part of kvroute (router/contract/_chainhash.c, the block-hash chain, built as
kvroute.router.contract._chainhash).

Everything else is in pyproject.toml. `optional=True`: without a C compiler, or where it
does not build, the install goes on and router/contract/protocol.py hashes in pure Python.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("kvroute.router.contract._chainhash", ["router/contract/_chainhash.c"], optional=True)])
