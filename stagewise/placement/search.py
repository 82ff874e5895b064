"""Search: the best legal placement with exactly k stages, over device orders and cuts."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from itertools import pairwise

from stagewise.hardware.device_info import DeviceInfo
from stagewise.hardware.topology import Topology
from stagewise.placement.cost_model import handoff_ps
from stagewise.placement.cut_search import Key, best_cuts, evaluate_cuts, greedy_ranges, greedy_reach
from stagewise.placement.device_orders import MAX_ORDERS, class_orders, interchangeable_classes
from stagewise.placement.stage_table import DeviceCosts, StageTable
from stagewise.spec.model_spec import ModelSpec
from stagewise.spec.profile import Profile


@dataclass(frozen=True)
class Found:
    """A legal k-stage solution: devices in stage order, cut points and its objective key."""

    order: tuple[str, ...]
    cuts: tuple[int, ...]
    key: Key
    handoffs_ps: tuple[int, ...]


@dataclass(frozen=True)
class Miss:
    """Why no legal k-stage placement was found: the least-overflowing attempt."""

    device_id: str
    stage_index: int
    overflow_bytes: int
    budget_bytes: int
    order: tuple[str, ...] = ()  # the attempt's devices in stage order
    ranges: tuple[tuple[int, int], ...] = ()  # its stages' block ranges, up to the one that overflows


class Searcher:
    """Prices stages of one (spec, topology, profile) and searches orders of k devices."""

    def __init__(self, spec: ModelSpec, topology: Topology, profile: Profile, devices: list[DeviceInfo]) -> None:
        self.spec, self.topology, self.profile = spec, topology, profile
        self.devices = devices
        self.table = StageTable.build(spec, profile)
        self.costs = {d.id: DeviceCosts.build(spec, profile, d) for d in devices}
        self.rank = {d.id: i for i, d in enumerate(topology.devices)}
        self.classes = interchangeable_classes(topology, devices)
        self._handoff: dict[tuple[str, str], int] = {}
        self.exhaustive = True

    def with_profile(self, profile: Profile) -> Searcher:
        """The same devices priced under ``profile``; the interchangeable device classes and ranks
        (which depend on the topology alone) are reused rather than recomputed."""
        other = copy.copy(self)
        other.profile = profile
        other.table = StageTable.build(self.spec, profile)
        other.costs = {d.id: DeviceCosts.build(self.spec, profile, d) for d in self.devices}
        other._handoff = {}
        other.exhaustive = True
        return other

    def handoffs(self, order: list[str]) -> list[int]:
        out = []
        for a, b in pairwise(order):
            if (a, b) not in self._handoff:
                self._handoff[(a, b)] = handoff_ps(self.spec, self.profile, self.topology.link(a, b))
            out.append(self._handoff[(a, b)])
        return [*out, 0]

    def orders(self, k: int, fixed: list[str] | None = None) -> list[list[str]]:
        if fixed is not None:
            return [fixed]
        out = []
        for i, seq in enumerate(class_orders(self.classes, k)):
            if i >= MAX_ORDERS:
                self.exhaustive = False
                break
            out.append([d.id for d in seq])
        return out

    def best(self, k: int, objective: str, fixed_order: list[str] | None = None, cuts: list[int] | None = None) -> Found | None:
        """Best legal k-stage placement (ties: lower key, then canonical device ranks)."""
        best: tuple[Key, tuple[int, ...]] | None = None
        found: Found | None = None
        for order in self.orders(k, fixed_order):
            dev = [self.costs[i] for i in order]
            if cuts is None and not greedy_reach(self.table, dev)[0]:
                continue
            hand = self.handoffs(order)
            if cuts is None:
                result = best_cuts(self.table, dev, hand, objective)
                if result is None:
                    continue
                key, chosen = result
            else:
                maybe, _ = evaluate_cuts(self.table, dev, hand, cuts, objective)
                if maybe is None:
                    continue
                key, chosen = maybe, cuts
            rank = (key, tuple(self.rank[i] for i in order))
            if best is None or rank < best:
                best = rank
                found = Found(tuple(order), tuple(chosen), key, tuple(hand))
        return found

    def feasible(self, k: int) -> bool:
        return any(greedy_reach(self.table, [self.costs[i] for i in o])[0] for o in self.orders(k))

    def miss(self, k: int, fixed_order: list[str] | None = None, cuts: list[int] | None = None) -> Miss:
        """The attempt that overflows least (greedy fill, or the fixed cuts when given)."""
        best: Miss | None = None
        for order in self.orders(k, fixed_order):
            dev = [self.costs[i] for i in order]
            if cuts is not None:
                _, totals = evaluate_cuts(self.table, dev, self.handoffs(order), cuts, "latency")
                over = [(t - d.budget_bytes, j) for j, (t, d) in enumerate(zip(totals, dev, strict=True))]
                overflow, j = max(over)
                bounds = [0, *cuts, self.spec.num_blocks]
                ranges = tuple(pairwise(bounds))
            else:
                _, j, overflow = greedy_reach(self.table, dev)
                ranges = tuple(greedy_ranges(self.table, dev))
            m = Miss(order[j], j, overflow, dev[j].budget_bytes, tuple(order), ranges)
            if best is None or m.overflow_bytes < best.overflow_bytes:
                best = m
        assert best is not None
        return best
