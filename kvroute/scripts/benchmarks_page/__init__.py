"""The benchmarks page, docs/benchmarks.md: its registry of commands (entries.py), how their JSON is shown
(render.py), and the generator that runs them and writes the page (`python -m kvroute.scripts.benchmarks_page`)."""
