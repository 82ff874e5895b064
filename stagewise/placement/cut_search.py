"""Cut search: for one device order, the best legal cut points (exact dynamic programme).

Stage ``j`` of ``k`` runs on ``order[j]`` and covers ``[c_j, c_{j+1})`` with ``c_0 = 0``,
``c_k = B`` and at least one block each. A stage is legal iff its charge fits its own
device's budget; since a charge only grows when a range grows, scanning starts downward from
each end and stops at the first illegal start.

Keys are integer pairs minimized lexicographically. Latency: (sum of stage + handoff
picoseconds, highest budget use in parts per million) — on identical devices every split has
the same sum, so ties go to the placement whose fullest device is least full; combining is
monotone in that order, so the DP is exact. Throughput: first the least possible slowest
stage M* (stage + outgoing handoff), then the least sum with every stage at most M* — exact.
"""

from __future__ import annotations

from stagewise.placement.stage_table import DeviceCosts, StageTable

Key = tuple[int, int]


PPM = 1_000_000


def use_ppm(total_bytes: int, budget_bytes: int) -> int:
    """Budget use of a stage in parts per million (integer, exact)."""
    return total_bytes * PPM // max(budget_bytes, 1)


def _dp(
    table: StageTable, order: list[DeviceCosts], handoffs: list[int], mode: str, cap: int | None
) -> tuple[Key, list[int]] | None:
    n, k = table.num_blocks, len(order)
    if k > n:
        return None
    prev: list[tuple[int, int] | None] = [(0, 0)] + [None] * n  # best (p, q) ending at position a
    back: list[list[int]] = []
    for j, dev in enumerate(order):
        entry, exit = j == 0, j == k - 1
        h = handoffs[j]
        cur: list[tuple[int, int] | None] = [None] * (n + 1)
        choice = [-1] * (n + 1)
        lo_b, hi_b = (n, n) if exit else (j + 1, n - (k - 1 - j))
        for b in range(lo_b, hi_b + 1):
            ws = 0
            best: tuple[int, int] | None = None
            best_a = -1
            for a in range(b - 1, j - 1, -1):
                ws = max(ws, table.workspace[a])
                total = table.total(a, b, entry, exit, ws)
                if total > dev.budget_bytes:
                    break
                p = prev[a]
                if p is None or (entry and a != 0):
                    continue
                x = dev.cost(a, b, entry, exit) + h
                if cap is not None and x > cap:
                    continue
                if mode == "latency":
                    key = (p[0] + x, max(p[1], use_ppm(total, dev.budget_bytes)))
                elif mode == "bottleneck":
                    key = (max(p[0], x), p[1] + x)
                else:  # capped sum
                    key = (p[0] + x, max(p[1], x))
                if best is None or key < best:
                    best, best_a = key, a
            cur[b], choice[b] = best, best_a
        back.append(choice)
        prev = cur
    final = prev[n]
    if final is None:
        return None
    cuts = []
    position = n
    for j in range(k - 1, 0, -1):
        position = back[j][position]
        cuts.append(position)
    return final, cuts[::-1]


def best_cuts(
    table: StageTable, order: list[DeviceCosts], handoffs: list[int], objective: str
) -> tuple[Key, list[int]] | None:
    """Best ``(key, cuts)`` for ``order`` (``handoffs[j]``: ps from stage j to j+1, last 0),
    or None when no legal cut exists. ``key`` is (primary, secondary) of ``objective``."""
    if objective == "latency":
        return _dp(table, order, handoffs, "latency", cap=None)
    first = _dp(table, order, handoffs, "bottleneck", cap=None)
    if first is None:
        return None
    bottleneck = first[0][0]
    second = _dp(table, order, handoffs, "capped_sum", cap=bottleneck)
    assert second is not None  # the phase-1 solution satisfies the cap
    (total, slowest), cuts = second
    return (slowest, total), cuts


def evaluate_cuts(
    table: StageTable, order: list[DeviceCosts], handoffs: list[int], cuts: list[int], objective: str
) -> tuple[Key | None, list[int]]:
    """Key of a fixed cut (None if some stage is illegal) and each stage's charge total."""
    bounds = [0, *cuts, table.num_blocks]
    totals, costs = [], []
    k = len(order)
    for j, dev in enumerate(order):
        a, b = bounds[j], bounds[j + 1]
        totals.append(table.range_total(a, b, j == 0, j == k - 1))
        costs.append(dev.cost(a, b, j == 0, j == k - 1) + handoffs[j])
    if any(t > d.budget_bytes for t, d in zip(totals, order, strict=True)):
        return None, totals
    if objective == "latency":
        return (sum(costs), max(use_ppm(t, d.budget_bytes) for t, d in zip(totals, order, strict=True))), totals
    return (max(costs), sum(costs)), totals


def greedy_ranges(table: StageTable, order: list[DeviceCosts]) -> list[tuple[int, int]]:
    """The block ranges :func:`greedy_reach` fills, stage by stage, up to and including the stage that
    fails (a stage that cannot hold even one block is given one, as the overflow it reports)."""
    n, k = table.num_blocks, len(order)
    ranges: list[tuple[int, int]] = []
    a = 0
    for j, dev in enumerate(order[:n]):
        entry, exit = j == 0, j == k - 1
        if exit:
            ranges.append((a, n))
            break
        b, ws = a, 0
        limit = n - (k - 1 - j)
        while b < limit:
            ws2 = max(ws, table.workspace[b])
            if table.total(a, b + 1, entry, False, ws2) > dev.budget_bytes:
                break
            b, ws = b + 1, ws2
        if b == a:
            ranges.append((a, a + 1))
            break
        ranges.append((a, b))
        a = b
    return ranges


def greedy_reach(table: StageTable, order: list[DeviceCosts]) -> tuple[bool, int, int]:
    """Fill each stage with as many blocks as legal (leaving one per later stage).

    Returns (fits, index of the failing stage, its overflow bytes); exact for feasibility
    because charges grow with ranges.
    """
    n, k = table.num_blocks, len(order)
    if k > n:
        return False, k - 1, 0
    a = 0
    for j, dev in enumerate(order):
        entry, exit = j == 0, j == k - 1
        if exit:
            total = table.range_total(a, n, entry, True)
            return total <= dev.budget_bytes, j, max(0, total - dev.budget_bytes)
        b, ws = a, 0
        limit = n - (k - 1 - j)
        while b < limit:
            ws2 = max(ws, table.workspace[b])
            if table.total(a, b + 1, entry, False, ws2) > dev.budget_bytes:
                break
            b, ws = b + 1, ws2
        if b == a:
            return False, j, table.range_total(a, a + 1, entry, False) - dev.budget_bytes
        a = b
    return False, k - 1, 0  # unreachable
