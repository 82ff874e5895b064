"""One-off (issue 44): on PYTHONPATH with STAGEWISE_ALIGN_PROBE=FILE, the served engine (1) runs the identity
alignments as before the fix (every one in the 64-entry LRU, none kept for the CUDA graphs that captured
them) when STAGEWISE_ALIGN_LRU_ONLY=1, and (2) appends one JSON line to FILE whenever an alignment a decode
graph captured is freed (its rows, when), and at the first non-finite logits (the LRU's counts,
the graph alignments evicted so far). The A/B: the same burst with and without STAGEWISE_ALIGN_LRU_ONLY=1."""
import json
import os
import time
import weakref

PATH = os.environ.get("STAGEWISE_ALIGN_PROBE")
if PATH:
    import torch

    import stagewise.engine.sampling as sampling_mod
    import stagewise.kernels.moe_align as align_mod

    t0 = time.time()
    lru_only = os.environ.get("STAGEWISE_ALIGN_LRU_ONLY") == "1"
    graph_held: dict = {}  # key -> the data_ptr of sorted_slots a capture baked
    evicted: list = []
    made = align_mod._identity_alignment

    def _write(obj):  # type: ignore[no-untyped-def]
        with open(PATH, "a") as f:
            f.write(json.dumps(obj, default=str) + "\n")

    def identity_alignment(rows, block_m, device):  # type: ignore[no-untyped-def]
        key = (rows, block_m, str(device))
        if not lru_only:
            held = align_mod._CAPTURED.get((rows, block_m, device))
            if held is not None:
                return held
        alignment = made(rows, block_m, device)
        capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
        if capturing and key not in graph_held:
            graph_held[key] = alignment.sorted_slots.data_ptr()
            weakref.finalize(alignment.sorted_slots, _freed, key)  # the graph keeps no reference: freed = dangling
            if not lru_only:
                align_mod._CAPTURED[(rows, block_m, device)] = alignment
        return alignment

    def _freed(key):  # type: ignore[no-untyped-def]
        evicted.append(key)
        _write({"graph_alignment_freed": key, "t_s": round(time.time() - t0, 2), "lru": made.cache_info()._asdict()})

    for module in ("stagewise.kernels.moe_align", "stagewise.kernels.q8_0_gemm", "stagewise.kernels.packed_matmul"):
        mod = __import__(module, fromlist=["identity_alignment"])
        mod.identity_alignment = identity_alignment
    _non_finite = sampling_mod._non_finite
    state = {"said": False}

    def _probe_non_finite():  # type: ignore[no-untyped-def]
        if not state["said"]:
            state["said"] = True
            _write({"nonfinite_logits": True, "t_s": round(time.time() - t0, 2), "lru_only": lru_only,
                    "lru": made.cache_info()._asdict(), "graph_alignments": len(graph_held),
                    "graph_alignments_freed": evicted})
        return _non_finite()

    sampling_mod._non_finite = _probe_non_finite
