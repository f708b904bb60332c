"""The registry and renderers behind tools/benchmarks.py (modules, not scripts)."""
