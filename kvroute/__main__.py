"""`python -m kvroute`: the `kvroute` command."""

from kvroute.cli import console

console()
