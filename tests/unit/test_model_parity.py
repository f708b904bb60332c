"""Our paged forward against transformers' on the same saved checkpoint (logits within 1e-4)."""

import json

import pytest
import torch

from kvroute.engine.core.work import SamplingParams, SeqWork
from kvroute.engine.runners.model import attention
from kvroute.engine.runners.model.config import ModelConfig
from kvroute.engine.runners.torch_runner import TorchRunner

transformers = pytest.importorskip("transformers")
torch.set_num_threads(1)

TOL = 1e-4
GREEDY = SamplingParams(temperature=0.0)
SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=300, intermediate_size=128, max_position_embeddings=512,
             initializer_range=0.1)
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
VARIANTS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "llama_tied": ("LlamaConfig", "LlamaForCausalLM", {"tie_word_embeddings": True}),
    "llama3_rope": ("LlamaConfig", "LlamaForCausalLM", {"rope_parameters": LLAMA3_ROPE}),
    "qwen2_bias": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {}),
}


def save_hf_model(variant: str, path, **save_kwargs):
    config_cls, model_cls, extra = VARIANTS[variant]
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(getattr(transformers, config_cls)(**SMALL, **extra)).eval()
    with torch.no_grad():  # make q/k/v biases (Qwen2) non-trivial
        for name, param in model.named_parameters():
            if name.endswith(".bias"):
                param.normal_(0, 0.1)
    model.save_pretrained(path, **save_kwargs)
    return model


@pytest.fixture(scope="module")
def llama_pair(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama")
    model = save_hf_model("llama", path, max_shard_size="100KB")  # sharded, with an index
    assert (path / "model.safetensors.index.json").is_file()
    runner = TorchRunner(num_blocks=64, block_size=16, model_dir=path)
    yield model, runner
    runner.close()


@pytest.fixture(params=["flash_lse", "masked_sdpa"])
def prefix_path(request, monkeypatch):
    """Both ways `prefix_attention` can run: split + log-sum-exp merge, or one masked call."""
    if request.param == "masked_sdpa":
        monkeypatch.setattr(attention, "_FLASH_CPU", None)
    return request.param


def hf_logits(model, ids) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]  # (T, V)


def prompt(n: int, seed: int) -> list[int]:
    return torch.randint(0, 300, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def assert_close(ours: torch.Tensor, ref: torch.Tensor) -> None:
    diff = (ours - ref).abs().max().item()
    assert diff <= TOL, f"max abs logit diff {diff:.3g} > {TOL}"
    assert ours.argmax(-1).tolist() == ref.argmax(-1).tolist()


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_full_prefill_matches_transformers(variant, tmp_path):
    model = save_hf_model(variant, tmp_path)
    runner = TorchRunner(num_blocks=64, block_size=16, model_dir=tmp_path)
    ids = prompt(40, seed=1)
    work = SeqWork(0, tuple(ids), 0, (9, 4, 11), True, GREEDY)
    ref = hf_logits(model, ids)[-1]
    assert_close(runner.forward_logits([work])[0], ref)
    assert runner.execute_sync([work]) == [int(ref.argmax())]
    runner.close()


def test_prefill_after_cached_prefix(llama_pair, prefix_path):
    model, runner = llama_pair
    ids = prompt(41, seed=2)
    ref = hf_logits(model, ids)
    table = (5, 1, 30)
    first = runner.forward_logits([SeqWork(0, tuple(ids[:32]), 0, table, True, GREEDY)])
    assert_close(first[0], ref[31])
    rest = runner.forward_logits([SeqWork(0, tuple(ids[32:]), 32, table, True, GREEDY)])
    assert_close(rest[0], ref[-1])


def test_chunked_prefill_every_chunk(llama_pair, prefix_path):
    model, runner = llama_pair
    ids = prompt(40, seed=3)
    ref = hf_logits(model, ids)
    table = (7, 2, 40)
    for start in range(0, 40, 7):  # chunks end mid-block: 7, 14, ..., 40
        chunk = tuple(ids[start:start + 7])
        logits = runner.forward_logits([SeqWork(0, chunk, start, table, True, GREEDY)])
        assert_close(logits[0], ref[start + len(chunk) - 1])


def test_batched_decode_of_different_lengths(llama_pair):
    model, runner = llama_pair
    lengths, tables = (5, 17, 33), ((10,), (11, 12), (13, 14, 15))
    prompts = [prompt(n, seed=10 + n) for n in lengths]
    for i, (ids, table) in enumerate(zip(prompts, tables)):
        runner.execute_sync([SeqWork(i, tuple(ids[:-1]), 0, table, False, GREEDY)])
    works = [SeqWork(i, (ids[-1],), len(ids) - 1, table, True, GREEDY)
             for i, (ids, table) in enumerate(zip(prompts, tables))]
    logits = runner.forward_logits(works)
    refs = torch.stack([hf_logits(model, ids)[-1] for ids in prompts])
    assert_close(logits, refs)
    assert runner.execute_sync(works) == refs.argmax(-1).tolist()


def test_mixed_step_of_decodes_and_prefill_chunks(llama_pair):
    model, runner = llama_pair
    dec, pre, fresh = prompt(20, seed=20), prompt(30, seed=21), prompt(9, seed=22)
    runner.execute_sync([SeqWork(0, tuple(dec[:-1]), 0, (20, 21), False, GREEDY),
                         SeqWork(1, tuple(pre[:12]), 0, (22, 23), False, GREEDY)])
    works = [SeqWork(1, tuple(pre[12:]), 12, (22, 23), True, GREEDY),  # chunk after a prefix
             SeqWork(2, tuple(fresh), 0, (24,), False, GREEDY),  # fresh chunk, no sample
             SeqWork(0, (dec[-1],), 19, (20, 21), True, GREEDY)]
    logits = runner.forward_logits(works)
    assert logits.shape == (2, 300)
    assert_close(logits, torch.stack([hf_logits(model, pre)[-1], hf_logits(model, dec)[-1]]))
    after = runner.forward_logits([SeqWork(2, (7,), 9, (24,), True, GREEDY)])
    assert_close(after[0], hf_logits(model, fresh + [7])[-1])


def test_rejects_other_architectures(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"],
                                                      "n_embd": 64}))
    with pytest.raises(ValueError, match="architecture GPT2LMHeadModel is not supported"):
        ModelConfig.from_hf_dir(tmp_path)
    with pytest.raises(ValueError, match="GPT2LMHeadModel"):
        TorchRunner(num_blocks=8, model_dir=tmp_path)


def test_rejects_unsupported_rope_scaling_and_missing_files(tmp_path):
    hf = transformers.LlamaConfig(**SMALL).to_dict()
    hf["architectures"] = ["LlamaForCausalLM"]
    hf["rope_parameters"] = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0}
    (tmp_path / "config.json").write_text(json.dumps(hf))
    with pytest.raises(ValueError, match="rope scaling of type 'yarn' is not supported"):
        ModelConfig.from_hf_dir(tmp_path)
    hf["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0}
    (tmp_path / "config.json").write_text(json.dumps(hf))
    with pytest.raises(ValueError, match="no \\*.safetensors weights"):
        TorchRunner(num_blocks=8, model_dir=tmp_path)
    with pytest.raises(ValueError, match="no config.json"):
        ModelConfig.from_hf_dir(tmp_path / "absent")


def test_rejects_checkpoint_with_missing_shard_or_tensor(tmp_path):
    for name in ("no_shard", "no_tensor"):
        save_hf_model("llama", tmp_path / name, max_shard_size="100KB")
    index = json.loads((tmp_path / "no_shard" / "model.safetensors.index.json").read_text())
    shard = index["weight_map"]["model.norm.weight"]
    (tmp_path / "no_shard" / shard).unlink()
    with pytest.raises(ValueError, match=f"shard {shard} listed in model.safetensors.index.json is missing"):
        TorchRunner(num_blocks=8, model_dir=tmp_path / "no_shard")
    del index["weight_map"]["model.norm.weight"]
    (tmp_path / "no_tensor" / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match="lacks tensor model.norm.weight"):
        TorchRunner(num_blocks=8, model_dir=tmp_path / "no_tensor")
