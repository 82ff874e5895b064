"""One-off (issue 44): on PYTHONPATH with STAGEWISE_NAN_PROBE=FILE, the served engine reports where the
first non-finite logits come from. When a row's logits are first non-finite it writes one JSON object
to FILE: that row's sequence (prompt length, length, row, prefix-cache hit), its state-slot entries,
which state entries and which of its KV blocks hold non-finite values in every block, and which
packed steps (eager) first produced a non-finite block output (every HybridBlock's output checked per
token while not capturing a graph). Nothing else changes."""
import json
import os

PATH = os.environ.get("STAGEWISE_NAN_PROBE")
if PATH:
    import torch

    import stagewise.engine.batcher as batcher_mod
    import stagewise.engine.sampling as sampling_mod
    import stagewise.models.hybrid as hybrid_mod

    state = {"batcher": None, "dumped": False, "first_block": None, "steps": 0}
    _init = batcher_mod.Batcher.__init__

    def _probe_init(self, *a, **k):  # type: ignore[no-untyped-def]
        _init(self, *a, **k)
        state["batcher"] = self

    batcher_mod.Batcher.__init__ = _probe_init
    _forward = hybrid_mod.HybridBlock.forward

    def _probe_forward(self, hidden, ctx, st):  # type: ignore[no-untyped-def]
        out = _forward(self, hidden, ctx, st)
        if state["first_block"] is None and not (out.is_cuda and torch.cuda.is_current_stream_capturing()):
            bad = (~torch.isfinite(out.float())).flatten(1).any(1)
            if bool(bad.any()):
              try:
                layout = ctx.layout
                state["first_block"] = {
                    "block": self.linear_attn.__class__.__name__ if self.is_linear else "attention",
                    "tokens_bad": bad.nonzero().flatten().tolist()[:16], "tokens": int(out.shape[0]),
                    "layout": None if layout is None else {"rows": layout.rows, "starts": layout.starts,
                                                           "lengths": layout.lengths, "decoding": layout.decoding,
                                                           "snapshots": layout.snapshots},
                    "input_finite": bool(torch.isfinite(hidden.float()).all())}
                _write({"first_nonfinite_block_output": state["first_block"]})
              except Exception as e:  # noqa: BLE001 (a probe: report, never break the step)
                state["first_block"] = {"error": repr(e)}
                _write({"first_nonfinite_block_output_error": repr(e)})
        return out

    hybrid_mod.HybridBlock.forward = _probe_forward
    _non_finite = sampling_mod._non_finite

    def _write(obj):  # type: ignore[no-untyped-def]
        with open(PATH, "a") as f:
            f.write(json.dumps(obj, default=str) + "\n")

    def _probe_non_finite():  # type: ignore[no-untyped-def]
        b = state["batcher"]
        if b is not None and not state["dumped"]:
            state["dumped"] = True
            try:
                _dump(b)
            except Exception as e:  # noqa: BLE001
                _write({"dump_error": repr(e)})
        return _non_finite()

    def _dump(b):  # type: ignore[no-untyped-def]
        if True:
            seqs = [s for s in (*b.decoding, *b.staging) if s is not None]
            stage = b.pipeline.stages[0]
            slots = stage.states.slots
            pools = {}
            for i, block in stage.states.blocks.items():
                for name, t in (getattr(block, "pools", None) or {"key": block.key, "value": block.value}).items():
                    bad = (~torch.isfinite(t.float())).flatten(1).any(1).nonzero().flatten().tolist()
                    if bad:
                        pools[f"{i}.{name}"] = bad[:24]
            _write({"nonfinite_logits": True, "first_snapshot": slots.first_snapshot if slots else None,
                    "table": slots.table.tolist() if slots else None,
                    "sequences": [{"row": s.row, "prompt": len(s.request.prompt_ids), "length": s.length,
                                   "generated": s.generated, "blocks": list(s.blocks)[:8],
                                   "preemptions": s.preemptions} for s in seqs],
                    "nonfinite_entries": pools, "snapshot_evictions": getattr(b.kv.snapshots, "evictions", None),
                    "hit_tokens": b.kv.hit_tokens, "preemptions": b.preemptions})

    sampling_mod._non_finite = _probe_non_finite

    # Every step (STAGEWISE_NAN_PROBE_STEPS=1): after each collected step, the device synchronized, the first
    # step that leaves a non-finite value in any state pool is reported once: its rows and layout, which
    # entries of which layers' pools, and whose entries they are (row, read or write) by the table.
    if os.environ.get("STAGEWISE_NAN_PROBE_STEPS") == "1":
        state["steps_seen"] = 0
        state["step_reported"] = False
        _retire = batcher_mod.Batcher._retire

        def _probe_retire(self, item):  # type: ignore[no-untyped-def]
            rows = [None if s is None else s.row for s in item.rows]
            group = item.group
            out = _retire(self, item)
            state["steps_seen"] += 1
            if not state["step_reported"]:
                try:
                    if torch.cuda.is_available():
                        torch.cuda.synchronize()
                    st = self.pipeline.stages[0].states
                    bad = {}
                    for i, block in st.blocks.items():
                        for name, t in (getattr(block, "pools", None) or {}).items():
                            per = (~torch.isfinite(t.float())).flatten(1).any(1).nonzero().flatten().tolist()
                            if per:
                                bad[f"{i}.{name}"] = per
                    if bad:
                        state["step_reported"] = True
                        slots = st.slots
                        table = slots.table.tolist() if slots else []
                        owner = {}
                        for r, (rd, wr) in enumerate(table):
                            owner.setdefault(rd, []).append(f"r{r}:read")
                            owner.setdefault(wr, []).append(f"r{r}:write")
                        entries = sorted({e for v in bad.values() for e in v})
                        _write({"first_nonfinite_state_after_step": state["steps_seen"], "step_rows": rows,
                                "group": group, "layers": sorted(bad), "entries": entries,
                                "owners": {e: owner.get(e, ["free or snapshot"]) for e in entries},
                                "first_snapshot": slots.first_snapshot if slots else None,
                                "live": {s.row: [s.length, s.generated] for s in (*self.decoding, *self.staging)
                                         if s is not None}})
                except Exception as e:  # noqa: BLE001
                    state["step_reported"] = True
                    _write({"step_probe_error": repr(e)})
            return out

        batcher_mod.Batcher._retire = _probe_retire
