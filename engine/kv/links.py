"""Named KV links: (bytes/s, seconds of latency), the modelled figures of the sim runner's pulls and tiers
(engine/runners/sim.py) and the starting figures of every engine's tier links (engine/kv/tier_setup.py:
`--kv-host-link` / `--kv-store-link`, else by device type and store scheme), before the engine measures its own."""

from __future__ import annotations

# Modelled KV links for prefill -> decode pulls: (bytes/s, seconds of latency per pull).
# NVLink 4 (H100: 900 GB/s bidirectional, ~450 GB/s one way; we take 300 GB/s achieved),
# 200 Gb/s InfiniBand NDR per GPU (~25 GB/s achieved), and this machine's loopback as
# measured by kvroute/benchmarks/disagg.py with the torch runner (about 1 GB/s, 2 ms per pull).
#
# Tier links (the host pool and the shared store, docs/architecture.md#kv-tiers), from published figures:
# PCIe 4.0 x16 (A100 hosts): 31.5 GB/s per direction theoretical, ~25 GB/s measured with pinned
# memory (CUDA bandwidthTest); PCIe 5.0 x16 (H100 hosts): 63 GB/s theoretical, ~50 GB/s measured;
# a PCIe 4.0 NVMe SSD: ~7 GB/s sequential read (Samsung 990 PRO: 7.45 GB/s read, 6.9 GB/s write),
# ~100 us to the first byte; an RDMA-attached store over 200 Gb/s InfiniBand: "infiniband" above.
# The cpu-* links are this machine (tiny model, 32 KiB blocks), medians of 3 runs of
# `python -m kvroute.benchmarks.tiers links`: torch index_select/index_copy_ between two host tensors, and
# the engine's own store path (engine/kv/store: a local redis-server, one file per block; reads
# include checking every entry).
LINKS: dict[str, tuple[float, float]] = {
    "nvlink": (300e9, 10e-6),
    "infiniband": (25e9, 20e-6),
    "loopback": (1e9, 2e-3),
    "pcie4": (25e9, 10e-6),
    "pcie5": (50e9, 10e-6),
    "nvme": (7e9, 100e-6),
    "cpu-memcpy": (5.5e9, 5e-6),  # host-to-device 5.8 GB/s, 4.6 us; device-to-host 5.4 GB/s, 7 us
    "cpu-redis": (0.57e9, 70e-6),  # MGET + entry checks; writes (pipelined SET) 0.66 GB/s, 120 us
    "cpu-file": (0.81e9, 130e-6),  # reads (page cache, one thread hop) + entry checks; writes 0.10 GB/s
}
DEFAULT_HOST_LINK = {"cpu": "cpu-memcpy", "cuda": "pcie4"}  # by device type
DEFAULT_STORE_LINK = {"redis": "cpu-redis", "rediss": "cpu-redis", "file": "cpu-file"}  # by URL scheme
