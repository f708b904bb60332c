"""An adapter PEFT itself wrote, served by `kvroute engine --model DIR --lora-modules NAME=DIR`: greedy
outputs over HTTP, in a batch mixing the adapter and the base model, equal transformers' greedy outputs of
the model with the adapter merged into its weights by PEFT (`merge_and_unload`)."""

import asyncio

import pytest
import torch

from kvroute.router.contract.tokenizer import load_tokenizer
from tests.support.hf_checkpoint import build_checkpoint

peft = pytest.importorskip("peft")
# peft 0.21 reads transformers' deprecated `is_gradient_checkpointing` when it wraps a model
pytestmark = pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
STEPS = 8


def greedy(model, ids: list[int]) -> list[int]:
    """The argmax at each step, EOS included and not stopped at (as `ignore_eos` asks of the engine)."""
    ids = list(ids)
    with torch.no_grad():
        for _ in range(STEPS):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[-STEPS:]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """(model dir, adapter dir, merged model, base model): rank 8 on every projection, B not zero."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("peft")
    (root / "tiny-llama").mkdir()
    base = build_checkpoint(root / "tiny-llama").eval()
    config = peft.LoraConfig(r=8, lora_alpha=16, target_modules=TARGETS, init_lora_weights=False)
    (root / "scratch").mkdir()  # a second copy of the same weights (seeded) for PEFT to wrap and merge
    wrapped = peft.get_peft_model(build_checkpoint(root / "scratch"), config)
    wrapped.save_pretrained(root / "sql")
    return root / "tiny-llama", root / "sql", wrapped.merge_and_unload().eval(), base


async def test_greedy_outputs_of_a_peft_adapter_equal_the_merged_models_in_a_mixed_batch(
        checkpoint, start_engine, http):
    model_dir, adapter_dir, merged, base = checkpoint
    tok = load_tokenizer(model_dir)
    prompts = [tok.encode("The quick brown fox jumps over the lazy dog " * n) for n in (1, 2, 3)]
    url, _ = await start_engine(backend="torch", model=str(model_dir), lora_modules=(f"sql={adapter_dir}",),
                                max_loras=1)

    async def complete(ids, model):
        body = {"prompt": ids, "model": model, "max_tokens": STEPS, "temperature": 0, "ignore_eos": True}
        async with http.post(url + "/v1/completions", json=body) as r:
            assert r.status == 200, await r.text()
            return (await r.json())["choices"][0]["text"]

    asks = [(p, m) for p in prompts for m in ("sql", "tiny-llama")]  # sent at once: steps mix both
    got = await asyncio.gather(*(complete(p, m) for p, m in asks))
    want = [tok.decode(greedy(merged if m == "sql" else base, p)) for p, m in asks]
    assert got == want
    assert all(got[i] != got[i + 1] for i in range(0, len(got), 2))  # the adapter changes the output
