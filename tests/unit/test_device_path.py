"""The design that makes a step cheap on a GPU, held on CPU: a decode step is a short fixed list of
operations per layer, a step never reads from the device before its one synchronisation, and the
padded decode path that CUDA graphs replay computes what the eager step does."""

import contextlib
import dataclasses

import pytest
import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode

from kvroute.engine.core.work import SamplingParams, SeqWork
from kvroute.engine.runners.model.config import ModelConfig
from kvroute.engine.runners.model.decode_graphs import DecodeGraphs
from kvroute.engine.runners.torch_runner import TorchRunner

torch.set_num_threads(1)

BS = 16
GREEDY = SamplingParams(temperature=0.0)
# Operations that only describe a tensor differently: they launch nothing.
VIEWS = {"view", "reshape", "slice", "select", "transpose", "unsqueeze", "squeeze", "split", "split_with_sizes",
         "chunk", "unflatten", "flatten", "t", "expand", "permute", "as_strided", "_unsafe_view", "alias",
         "detach", "detach_", "lift_fresh", "resolve_conj", "resolve_neg", "empty", "contiguous"}
MAX_OPS_PER_LAYER = 20  # was 36 with per-layer masks, RMSNorm in pieces and per-layer allocations
MAX_OPS_PER_STEP = 25  # embedding, rotary tables, masks, final norm, logits, argmax


def runner_with(num_layers: int = 2, **kw) -> TorchRunner:
    return TorchRunner(ModelConfig(num_layers=num_layers), num_blocks=256, block_size=BS, **kw)


def prefilled(runner: TorchRunner, lengths, first: int = 0) -> list[SeqWork]:
    """Sequences first, first + 1, ... of these prompt lengths, prefilled; returns each one's next decode work."""
    works = []
    for i, n in enumerate(lengths, first):
        table = tuple(range(16 * i, 16 * i + 16))
        tokens = tuple(5 + (7 * i + j) % 8000 for j in range(n))
        runner.execute_sync([SeqWork(i, tokens, 0, table, True, GREEDY)])
        works.append(SeqWork(i, (11 + i,), n, table, True, GREEDY))
    return works


def decode_ops(num_layers: int, adapters=()) -> int:
    """Operations of a decode step of 4 sequences; with `adapters`, the first two rows under them."""
    runner = runner_with(num_layers, adapters=adapters, max_loras=max(len(adapters), 1))
    try:
        works = prefilled(runner, (20, 33, 47, 64))
        works = [dataclasses.replace(w, adapter=a.name, adapter_slot=i)
                 for i, (w, a) in enumerate(zip(works, adapters))] + works[len(adapters):]
        runner.execute_sync(works)  # warm-up
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            runner.execute_sync(works)
    finally:
        runner.close()
    top = [e.name for e in prof.events() if e.name.startswith("aten::")
           and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))]
    return sum(1 for name in top if name[len("aten::"):] not in VIEWS)


def test_a_decode_step_is_a_short_fixed_list_of_operations_per_layer():
    two, four = decode_ops(2), decode_ops(4)
    per_layer = (four - two) / 2
    assert per_layer <= MAX_OPS_PER_LAYER
    assert two - 2 * per_layer <= MAX_OPS_PER_STEP


def test_adapters_add_three_operations_per_adapted_projection_and_nothing_else(tmp_path):
    from kvroute.engine.runners.lora_config import read_adapter
    from kvroute.engine.runners.lora_files import write_random_adapter

    def adapters(num_layers):
        config = ModelConfig(num_layers=num_layers)
        return tuple(read_adapter(n, str(write_random_adapter(tmp_path / f"{n}{num_layers}", config, seed=i)), 16)
                     for i, n in enumerate(("a", "b")))

    two, four = decode_ops(2, adapters(2)), decode_ops(4, adapters(4))
    assert (four - two) / 2 == (decode_ops(4) - decode_ops(2)) / 2 + 4 * 3  # 4 projections: mm, mul, addmm
    assert two - decode_ops(2) == 2 * 4 * 3 + 2  # and once a step: the rows' one-hot slots (eq, to)


def test_a_step_with_adapters_reads_nothing_back_before_its_one_synchronisation(monkeypatch, tmp_path):
    from kvroute.engine.runners.lora_config import read_adapter
    from kvroute.engine.runners.lora_files import write_random_adapter

    spec = read_adapter("a", str(write_random_adapter(tmp_path / "a", ModelConfig(num_layers=2))), 16)
    runner = runner_with(adapters=(spec,), max_loras=1)
    try:
        works = [dataclasses.replace(w, adapter="a", adapter_slot=0) if i % 2 else w
                 for i, w in enumerate(mixed_step(runner))]
        with HostReads().watching(monkeypatch) as watch, torch.inference_mode():
            runner._forward(works)
        assert watch.reads == []
    finally:
        runner.close()


class HostReads(TorchDispatchMode):
    """Counts what would make the host wait for the device: a tensor's value read in Python
    (item, bool, int, tolist, cpu) or an operation whose output shape depends on its data."""

    def __init__(self):
        super().__init__()
        self.reads: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        tags = getattr(func, "tags", ())
        if func is torch.ops.aten._local_scalar_dense.default or torch.Tag.data_dependent_output in tags \
                or (torch.Tag.dynamic_output_shape in tags and not _integer_indexing(func, args)):
            self.reads.append(str(func))
        return func(*args, **(kwargs or {}))

    @contextlib.contextmanager
    def watching(self, monkeypatch):
        for name in ("tolist", "cpu"):
            original = getattr(torch.Tensor, name)

            def counted(t, *a, _name=name, _original=original, **k):
                self.reads.append(_name)
                return _original(t, *a, **k)

            monkeypatch.setattr(torch.Tensor, name, counted)
        with self:
            yield self


def _integer_indexing(func, args) -> bool:
    """Indexing by integer tensors: its shape is the indices', nothing is read (a boolean mask would be)."""
    if func.__name__.split(".")[0] not in ("index", "index_put", "index_put_", "_index_put_impl_"):
        return False
    return all(i is None or i.dtype != torch.bool for i in args[1])


def mixed_step(runner: TorchRunner) -> list[SeqWork]:
    """Decodes (greedy, sampled, with logprobs and a logit bias) and a prefill chunk after a cached prefix."""
    decodes = prefilled(runner, (20, 33, 47))
    decodes[1] = SeqWork(1, decodes[1].token_ids, 33, decodes[1].block_table, True,
                         SamplingParams(temperature=0.8, seed=3))
    decodes[2] = SeqWork(2, decodes[2].token_ids, 47, decodes[2].block_table, True,
                         SamplingParams(temperature=0.0, logprobs=2, logit_bias=((9, 5.0),)))
    prefix = prefilled(runner, (40,), first=3)[0]
    chunk = SeqWork(3, tuple(range(100, 124)), 40, prefix.block_table, True, GREEDY)
    return [*decodes, chunk]


@pytest.mark.parametrize("path", ["split", "masked"])
def test_a_step_reads_nothing_back_before_its_one_synchronisation(monkeypatch, path):
    from kvroute.engine.runners.model import attention

    if path == "masked":  # the path a CUDA device takes: the whole context in one masked call
        monkeypatch.setattr(attention, "_FLASH_CPU", None)
    runner = runner_with()
    try:
        works = mixed_step(runner)
        with HostReads().watching(monkeypatch) as watch, torch.inference_mode():
            runner._forward(works)
        assert watch.reads == []
        before = runner.readback.syncs
        out = runner.execute_sync(works)
        assert runner.readback.syncs == before + 1
        assert out.logprobs[2] is not None and len(out) == 4
    finally:
        runner.close()


def test_the_padded_decode_path_computes_what_the_eager_step_does(monkeypatch):
    runner = runner_with()
    try:
        works = prefilled(runner, (20, 33, 47, 64, 90))
        eager = runner.forward_logits(works)
        runner.graphs = DecodeGraphs(runner.model, runner.pool, runner.inputs, 64, 256, capture=False)
        pad = runner.graphs.bucket(works)
        assert (pad.rows, pad.blocks) == (8, 16)  # 5 rows padded to 8, 6 blocks to 16
        assert runner.graphs.bucket(works[:1] + [mixed_step(runner)[3]]) is None  # a prefill chunk: eager
        with HostReads().watching(monkeypatch) as watch, torch.inference_mode():
            runner._forward(works)
        assert watch.reads == []
        padded = runner.forward_logits(works)
        torch.testing.assert_close(padded, eager, rtol=1e-5, atol=1e-5)
        assert runner.execute_sync(works) == [int(t) for t in eager.argmax(-1)]
        scratch = runner.pool.data[runner.pool.scratch_block]
        assert scratch.abs().sum() > 0  # the padded rows wrote there, and nowhere else
    finally:
        runner.close()
