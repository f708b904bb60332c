"""LoRA adapters in the torch runner: a batch of mixed adapters gives each row what the base model with
its adapter MERGED into the weights (W + scale * B @ A, in float32) gives; PEFT files are checked."""

import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file

from kvroute.engine.core.work import SamplingParams, SeqWork
from kvroute.engine.runners.lora_config import WEIGHTS_FILE, parse_lora_modules, read_adapter, read_adapters
from kvroute.engine.runners.lora_files import write_random_adapter
from kvroute.engine.runners.model.config import ModelConfig
from kvroute.engine.runners.model.decode_graphs import DecodeGraphs
from kvroute.engine.runners.torch_runner import TorchRunner

torch.set_num_threads(1)

BS = 16
GREEDY = SamplingParams(temperature=0.0)
CONFIG = ModelConfig(num_layers=2)


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    """Two adapters: every projection at rank 8; q and v only at rank 4 with rsLoRA's scale."""
    root = tmp_path_factory.mktemp("adapters")
    write_random_adapter(root / "sql", CONFIG, rank=8, alpha=16, seed=1)
    write_random_adapter(root / "chat", CONFIG, rank=4, alpha=8, targets=("q_proj", "v_proj"), seed=2,
                         std=0.1, extra_config={"use_rslora": True})
    return read_adapters(parse_lora_modules([f"sql={root / 'sql'}", f"chat={root / 'chat'}"]), max_rank=16)


def merged_runner(spec) -> TorchRunner:
    """The base model with `spec` merged into its weights, straight from the PEFT file (no slots)."""
    runner = TorchRunner(CONFIG, num_blocks=64, block_size=BS)
    if spec is None:
        return runner
    tensors = load_file(f"{spec.path}/{WEIGHTS_FILE}")
    c = CONFIG
    q, kv, inter = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.intermediate_size
    rows = {"q_proj": ("self_attn.qkv_proj", 0, q), "k_proj": ("self_attn.qkv_proj", q, kv),
            "v_proj": ("self_attn.qkv_proj", q + kv, kv), "o_proj": ("self_attn.o_proj", 0, c.hidden_size),
            "gate_proj": ("mlp.gate_up_proj", 0, inter), "up_proj": ("mlp.gate_up_proj", inter, inter),
            "down_proj": ("mlp.down_proj", 0, c.hidden_size)}
    state = runner.model.state_dict()
    for i in range(c.num_layers):
        for module in spec.targets:
            linear, start, width = rows[module]
            block = "mlp" if linear.startswith("mlp") else "self_attn"
            prefix = f"base_model.model.model.layers.{i}.{block}.{module}"
            a, b = tensors[f"{prefix}.lora_A.weight"], tensors[f"{prefix}.lora_B.weight"]
            state[f"layers.{i}.{linear}.weight"][start:start + width] += spec.scale * (b @ a)
    return runner


def prompt(n: int, seed: int) -> tuple[int, ...]:
    return tuple(torch.randint(5, 8192, (n,), generator=torch.Generator().manual_seed(seed)).tolist())


def generate(runner: TorchRunner, requests, steps: int) -> list[list[int]]:
    """Greedy tokens of each (prompt, adapter, slot), all prefilled in one step and decoded in one batch."""
    tables = [tuple(range(8 * i, 8 * i + 8)) for i in range(len(requests))]
    works = [SeqWork(i, p, 0, tables[i], True, GREEDY, adapter=a, adapter_slot=s)
             for i, (p, a, s) in enumerate(requests)]
    out = [[t] for t in runner.execute_sync(works)]
    for _ in range(steps - 1):
        works = [dataclasses.replace(w, token_ids=(o[-1],), start_pos=len(p) + len(o) - 1, num_generated=len(o))
                 for w, o, (p, _, _) in zip(works, out, requests)]
        for o, t in zip(out, runner.execute_sync(works)):
            o.append(t)
    return out


def test_a_mixed_batch_gives_each_row_its_merged_adapters_greedy_tokens(adapters):
    sql, chat = adapters
    requests = [(prompt(37, 1), None, -1), (prompt(29, 2), "sql", 1), (prompt(45, 3), "chat", 0),
                (prompt(29, 2), None, -1)]
    runner = TorchRunner(CONFIG, num_blocks=64, block_size=BS, adapters=adapters, max_loras=2)
    try:
        mixed = generate(runner, requests, steps=12)
        assert runner.model.lora.slots == ["chat", "sql"] and runner.model.lora.loads == 2
    finally:
        runner.close()
    for (p, name, _), tokens in zip(requests, mixed):
        reference = merged_runner({"sql": sql, "chat": chat}.get(name))
        try:
            assert generate(reference, [(p, None, -1)], steps=12)[0] == tokens, name
        finally:
            reference.close()
    assert mixed[1] != mixed[3]  # the same prompt under an adapter: other tokens


def test_logits_match_the_merged_reference_and_base_rows_are_untouched(adapters):
    sql, _ = adapters
    p = prompt(40, 7)
    runner = TorchRunner(CONFIG, num_blocks=64, block_size=BS, adapters=adapters, max_loras=2)
    base, merged = merged_runner(None), merged_runner(sql)
    try:
        works = [SeqWork(0, p, 0, tuple(range(8)), True, GREEDY, adapter="sql", adapter_slot=0),
                 SeqWork(1, p, 0, tuple(range(8, 16)), True, GREEDY)]
        logits = runner.forward_logits(works)
        torch.testing.assert_close(logits[0], merged.forward_logits([works[1]])[0], rtol=1e-4, atol=1e-4)
        same_shape = [dataclasses.replace(works[0], adapter=None, adapter_slot=-1), works[1]]
        assert torch.equal(logits[1], base.forward_logits(same_shape)[1])  # adds exactly zero to a base row
        assert not torch.allclose(logits[0], logits[1], atol=1e-2)
    finally:
        for r in (runner, base, merged):
            r.close()


def test_a_slot_reloaded_with_another_adapter_computes_that_adapter(adapters):
    p = prompt(33, 4)
    runner = TorchRunner(CONFIG, num_blocks=64, block_size=BS, adapters=adapters, max_loras=1)
    try:
        first = runner.forward_logits([SeqWork(0, p, 0, tuple(range(8)), True, GREEDY, adapter="sql", adapter_slot=0)])
        runner.forward_logits([SeqWork(0, p, 0, tuple(range(8)), True, GREEDY, adapter="chat", adapter_slot=0)])
        again = runner.forward_logits([SeqWork(0, p, 0, tuple(range(8)), True, GREEDY, adapter="sql", adapter_slot=0)])
        assert torch.equal(first, again) and runner.model.lora.loads == 3
        with pytest.raises(ValueError, match="not one this runner loaded"):
            runner.forward_logits([SeqWork(0, p, 0, tuple(range(8)), True, GREEDY, adapter="sql", adapter_slot=1)])
    finally:
        runner.close()


def test_the_padded_decode_path_applies_each_rows_adapter_as_the_eager_step_does(adapters):
    runner = TorchRunner(CONFIG, num_blocks=64, block_size=BS, adapters=adapters, max_loras=2)
    try:
        requests = [(prompt(20, 1), "sql", 0), (prompt(33, 2), None, -1), (prompt(18, 3), "chat", 1)]
        tables = [tuple(range(8 * i, 8 * i + 8)) for i in range(3)]
        runner.execute_sync([SeqWork(i, p, 0, tables[i], True, GREEDY, adapter=a, adapter_slot=s)
                             for i, (p, a, s) in enumerate(requests)])
        decodes = [SeqWork(i, (11 + i,), len(p), tables[i], True, GREEDY, adapter=a, adapter_slot=s)
                   for i, (p, a, s) in enumerate(requests)]
        eager = runner.forward_logits(decodes)
        runner.graphs = DecodeGraphs(runner.model, runner.pool, runner.inputs, 8, 8, capture=False)
        assert runner.graphs.bucket(decodes) is not None
        torch.testing.assert_close(runner.forward_logits(decodes), eager, rtol=1e-5, atol=1e-5)
    finally:
        runner.close()


def test_peft_configs_kvroute_cannot_apply_are_refused_with_the_reason(tmp_path):
    def config_error(**extra) -> str:
        path = write_random_adapter(tmp_path / "a", CONFIG, rank=4, extra_config=extra)
        with pytest.raises(ValueError) as e:
            read_adapter("a", str(path), max_rank=16)
        return str(e.value)

    assert "DoRA" in config_error(use_dora=True)
    assert "bias 'all'" in config_error(bias="all")
    assert "1 to --max-lora-rank (16)" in config_error(r=32)
    assert "'lm_head' cannot be adapted" in config_error(target_modules=["q_proj", "lm_head"])
    assert "regular expression" in config_error(target_modules=".*proj")
    assert "peft_type" in config_error(peft_type="IA3")
    assert "lora_bias" in config_error(lora_bias=True)
    assert "activated LoRA" in config_error(alora_invocation_tokens=[5, 6])
    assert "exclude_modules" in config_error(target_modules="all-linear", exclude_modules=["q_proj"])
    spec = read_adapter("a", str(write_random_adapter(tmp_path / "b", CONFIG, rank=4, alpha=8,
                                                       extra_config={"target_modules": "all-linear"})), 16)
    assert spec.scale == 2.0 and len(spec.targets) == 7
    with pytest.raises(ValueError, match="no adapter_config.json"):
        read_adapter("x", str(tmp_path), 16)
    with pytest.raises(ValueError, match="NAME=DIR"):
        parse_lora_modules(["sql"])
    with pytest.raises(ValueError, match="twice"):
        parse_lora_modules(["a=/x", "a=/y"])
    with pytest.raises(ValueError, match="base model"):
        parse_lora_modules(["kvroute-tiny=/x"], base_model="kvroute-tiny")


def test_adapter_tensors_that_do_not_fit_the_model_are_refused(tmp_path):
    small = write_random_adapter(tmp_path / "small", dataclasses.replace(CONFIG, hidden_size=128), rank=4)
    with pytest.raises(ValueError, match="this model needs"):
        TorchRunner(CONFIG, num_blocks=8, block_size=BS, adapters=(read_adapter("s", str(small), 16),))
    deep = write_random_adapter(tmp_path / "deep", dataclasses.replace(CONFIG, num_layers=3), rank=4)
    with pytest.raises(ValueError, match="layers.2"):
        TorchRunner(CONFIG, num_blocks=8, block_size=BS, adapters=(read_adapter("d", str(deep), 16),))
    config = json.loads((deep / "adapter_config.json").read_text())
    assert config["r"] == 4
