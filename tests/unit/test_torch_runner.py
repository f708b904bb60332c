"""TorchRunner on the built-in tiny model: determinism, chunking/batching invariance, sampling, KV I/O."""

import asyncio

import pytest
import torch

from kvroute.engine.core.work import SamplingParams, SeqWork
from kvroute.engine.runners.model.config import ModelConfig
from kvroute.engine.runners.sampling import sample, step_seed, top_p_filter
from kvroute.engine.runners.torch_runner import TorchRunner

torch.set_num_threads(1)

BS = 16
GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture
def runner():
    r = TorchRunner(ModelConfig.tiny(), num_blocks=256, block_size=BS)
    yield r
    r.close()


def prompt(n: int, seed: int) -> list[int]:
    return torch.randint(0, 8192, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


class Seq:
    """A sequence driven through the runner the way a scheduler would."""

    def __init__(self, seq_id: int, ids: list[int], first_block: int, params=GREEDY, max_len=128):
        self.seq_id, self.tokens, self.params = seq_id, list(ids), params
        self.prompt_len, self.done = len(ids), 0  # done: tokens whose K/V is in the pool
        self.table = tuple(range(first_block, first_block + -(-max_len // BS)))

    def next_work(self, chunk: int) -> SeqWork:
        new = self.tokens[self.done:self.done + chunk]
        last = self.done + len(new) == len(self.tokens)
        num_generated = len(self.tokens) - self.prompt_len
        return SeqWork(self.seq_id, tuple(new), self.done, self.table, last, self.params, num_generated)

    def apply(self, work: SeqWork, token: int | None) -> None:
        self.done += work.num_new
        if token is not None:
            self.tokens.append(token)

    @property
    def generated(self) -> list[int]:
        return self.tokens[self.prompt_len:]


def run(runner: TorchRunner, seqs: list[Seq], num_tokens: int, chunk: int = 10_000) -> None:
    """Step all sequences together until each has generated num_tokens."""
    while any(len(s.generated) < num_tokens for s in seqs):
        active = [s for s in seqs if len(s.generated) < num_tokens]
        works = [s.next_work(chunk) for s in active]
        for s, w, t in zip(active, works, runner.execute_sync(works)):
            s.apply(w, t)


def test_tiny_model_is_deterministic():
    a, b = TorchRunner(num_blocks=8), TorchRunner(num_blocks=8)
    for (name, pa), (_, pb) in zip(a.model.state_dict().items(), b.model.state_dict().items()):
        assert torch.equal(pa, pb), name
    assert a.model.layers[0].self_attn.qkv_proj.weight.std().item() == pytest.approx(0.02, rel=0.05)
    work = SeqWork(0, tuple(prompt(20, 0)), 0, (1, 2), True, GREEDY)
    assert torch.equal(a.forward_logits([work]), b.forward_logits([work]))
    assert a.info.model == "kvroute-tiny" and a.info.vocab_size == 8192 and a.info.head_dim == 64
    a.close()
    b.close()


def test_greedy_same_with_chunked_prefill_and_batching(runner):
    ids = prompt(45, seed=1)
    alone = Seq(0, ids, first_block=0)
    run(runner, [alone], num_tokens=12)
    chunked = Seq(0, ids, first_block=10)
    run(runner, [chunked], num_tokens=12, chunk=7)
    others = [Seq(1, prompt(3, 2), 20), Seq(2, prompt(70, 3), 30), Seq(3, prompt(16, 4), 40)]
    batched = Seq(0, ids, first_block=50)
    run(runner, [others[0], batched, *others[1:]], num_tokens=12, chunk=7)
    assert len(alone.generated) == 12
    assert chunked.generated == alone.generated
    assert batched.generated == alone.generated


def test_seeded_sampling_is_reproducible(runner):
    params = SamplingParams(temperature=0.9, top_p=0.95, seed=1234)
    ids = prompt(30, seed=5)
    first = Seq(0, ids, 0, params)
    run(runner, [first], num_tokens=16)
    again = Seq(0, ids, 10, params)
    run(runner, [Seq(1, prompt(50, 6), 20, SamplingParams(temperature=1.0)), again], 16, chunk=7)
    other_seed = Seq(0, ids, 30, SamplingParams(temperature=0.9, top_p=0.95, seed=99))
    run(runner, [other_seed], num_tokens=16)
    assert again.generated == first.generated
    assert other_seed.generated != first.generated
    greedy = Seq(0, ids, 40)
    run(runner, [greedy], num_tokens=16)
    assert first.generated != greedy.generated  # temperature 0.9 over a flat tiny model


def test_sampling_edge_cases():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0], [5.0, 0.0, 0.0, 0.0]])
    gen = torch.Generator().manual_seed(0)
    tiny_p = SamplingParams(temperature=1.0, top_p=1e-6)
    assert sample(logits, [GREEDY, tiny_p], [0, 0], gen) == [1, 0]
    kept = top_p_filter(torch.tensor([0.5, 0.3, 0.15, 0.05]), 0.75)
    assert kept.tolist() == pytest.approx([0.5 / 0.8, 0.3 / 0.8, 0.0, 0.0])
    assert len({step_seed(7, n) for n in range(100)}) == 100
    assert step_seed(7, 3) != step_seed(8, 3)


def test_read_write_blocks_round_trip(runner):
    ids = prompt(40, seed=7)
    runner.execute_sync([SeqWork(0, tuple(ids), 0, (3, 4, 5), False, GREEDY)])
    data = runner.read_blocks([3, 4, 5])
    cfg = runner.config
    assert runner.kv_bytes_per_block == cfg.num_layers * 2 * BS * cfg.num_kv_heads * cfg.head_dim * 4
    assert len(data) == 3 * runner.kv_bytes_per_block
    assert data == runner.read_blocks([3]) + runner.read_blocks([4]) + runner.read_blocks([5])
    runner.write_blocks([100, 101, 102], data)
    assert runner.read_blocks([100, 101, 102]) == data
    next_token = (ids[-1] + 1) % 8192
    original = runner.forward_logits([SeqWork(0, (next_token,), 40, (3, 4, 5), True, GREEDY)])
    copied = runner.forward_logits([SeqWork(1, (next_token,), 40, (100, 101, 102), True, GREEDY)])
    assert torch.equal(original, copied)
    with pytest.raises(ValueError, match="expected"):
        runner.write_blocks([1], data)
    with pytest.raises(ValueError, match="block ids"):
        runner.read_blocks([256])


def test_rejects_malformed_work(runner):
    with pytest.raises(ValueError, match="can't hold"):
        runner.execute_sync([SeqWork(0, tuple(range(20)), 0, (1,), True, GREEDY)])
    with pytest.raises(ValueError, match="token ids"):
        runner.execute_sync([SeqWork(0, (8192,), 0, (1,), True, GREEDY)])
    with pytest.raises(ValueError, match="block ids"):
        runner.execute_sync([SeqWork(0, (1, 2), 0, (999,), True, GREEDY)])


async def test_execute_runs_off_the_event_loop(runner):
    ids = tuple(prompt(1024, seed=8))
    work = SeqWork(0, ids, 0, tuple(range(64)), True, GREEDY)
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.001)
            ticks += 1

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    result = await runner.execute([work])
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert ticks >= 1  # the loop kept running while the forward was computing
    assert result == runner.execute_sync([work])
    assert len(result) == 1 and 0 <= result[0] < 8192
