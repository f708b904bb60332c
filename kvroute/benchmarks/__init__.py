"""kvroute's benchmarks: commands that print figures and write JSON, each `python -m kvroute.benchmarks.NAME`.

They run from any directory and start what they measure as processes through the one process
harness (kvroute/loadgen/processes.py), the one `kvroute bench`, `kvroute chaos` and the tests use.
`python -m kvroute.benchmarks` lists them; docs/benchmarks.md shows the figures of the ones its
generator runs (`python -m kvroute.scripts.benchmarks_page`). This package sits on top of the
three programs: it may import any of them, and nothing in router/, engine/ or loadgen/ imports it
(docs/architecture.md#dependency-rule).
"""
