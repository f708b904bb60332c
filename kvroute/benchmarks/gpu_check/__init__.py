"""The engine on its device, in one command, with nothing downloaded.

    python -m kvroute.benchmarks.gpu_check --out DIR                          # CUDA, the 3B shape, bf16
    python -m kvroute.benchmarks.gpu_check --out DIR --device cpu --shape tiny [--quick]

Writes a checkpoint of random weights of a realistic shape (`--shape`, SHAPES below) with the
built-in tokenizer to DIR/model, then measures, each step writing DIR/gpu_check.json as it ends
(a run cut short keeps what it measured):

    memcpy    a plain pinned host<->device copy, GB/s each way: the ceiling for every copy below
    prefill   the runner's step (TorchRunner.execute_sync) on one prompt with 0, half and all but
              one block cached; all cached also right after a cold prompt (what a served repeat sees)
    decode    the runner's decode step at batch 1, 16 and 64 (CUDA graphs, and eager for comparison)
    serving   an engine over HTTP: TTFT of prompts of 1,024, the prefill step's and 4,096 tokens sent
              cold then again; the repeat against the runner's step (the serving overhead), and
              the engine's own step time for it
    bench     kvroute bench, 4 engines: round_robin, prefix_hash, kv_aware (TTFT, TPOT)
    tiers     kvroute bench --tiers: the session storm with device only, + host, + host + Redis
    pd_pull   a prefill and a decode engine behind a router that disaggregates: the pull's GB/s

Sized for at most 8 minutes on one H200-class GPU with the 3B shape (steps not started within
--budget-s are skipped; not yet run on a GPU); `--device cpu --shape tiny` runs the same steps in
under 3 minutes (128 s on a loaded 2-core machine); `--quick` takes every step at its smallest (one
engine per cluster, kv_aware alone, the storm with device only and host + Redis), as the test suite runs it.
docs/engine.md#the-device-check says how to read the result.
"""
