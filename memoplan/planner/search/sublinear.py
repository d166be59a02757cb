"""Chen et al. / MegEngine ``SublinearMemoryConfig``: bottleneck thresholds, then a seeded genetic search."""

from __future__ import annotations

import concurrent.futures
import math
import multiprocessing
import random
from bisect import bisect_left, insort
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import compress

from memoplan.planner.budgets import ByteBudget, byte_limit
from memoplan.planner.search.chain import Chain, Estimate, Item
from memoplan.planner.search.choice import Choice, make_choice
from memoplan.syntax.blocks import SublinearConfig

__all__ = ["GeneticReport", "SublinearResult", "sublinear"]


# ---------------------------------------------------------------- sublinear (Chen et al. + MegEngine)


@dataclass(frozen=True)
class GeneticReport:
    """How the genetic refinement compared with the best threshold."""

    thresholds: tuple[int, ...]  # the bottleneck thresholds tried, in bytes
    best_threshold: int
    threshold_checkpointed: tuple[int, ...]  # the best threshold candidate's set (chain indices)
    threshold: Estimate  # the best threshold candidate
    genetic: Estimate  # the best candidate after the generations (the chosen one)
    improved: bool  # the genetic search found a strictly better candidate
    seconds_saved: float  # threshold.seconds - genetic.seconds
    bytes_saved: int  # threshold.peak - genetic.peak
    generations: int
    evaluations: int  # candidates evaluated, thresholds included


@dataclass(frozen=True)
class SublinearResult:
    choice: Choice
    report: GeneticReport


def _score(columns, genome: bytes) -> tuple[int, float, int]:
    """Fitness key, smaller is better: (bytes over the limit, seconds, peak with the bottleneck floored)."""
    d, t, s, unplanned, lb, limit = columns[:6]
    if any(genome):
        peak = unplanned - sum(compress(d, genome)) + max(lb, max(compress(s, genome)))
    else:
        peak = unplanned
    return (max(0, peak - limit), math.fsum(compress(t, genome)), peak)


def _repair(columns, genome: bytes, grow: bool) -> bytes:
    """Local improvement of one candidate (so the genetic search is a memetic one).

    ``grow``: while over the limit, add modules, cheapest seconds per byte first, where that
    lowers the estimate.  Then, within the limit, drop checkpoints, dearest first, while it stays
    within.  With no budget the limit is 0, so only the first step runs: it lowers memory.
    """
    d, t, s, unplanned, lb, limit, best_first, worst_first = columns
    chosen = bytearray(genome)
    saved = sum(compress(d, chosen))
    sizes = sorted(compress(s, chosen))
    peak = unplanned - saved + max(lb, sizes[-1]) if sizes else unplanned
    if grow:
        for g in best_first:
            if peak <= limit:
                break
            if chosen[g]:
                continue
            new = unplanned - saved - d[g] + max(lb, s[g], sizes[-1] if sizes else 0)
            if new < peak:
                chosen[g] = 1
                saved += d[g]
                insort(sizes, s[g])
                peak = new
    if peak <= limit:
        for g in worst_first:
            if not chosen[g]:
                continue
            at = bisect_left(sizes, s[g])
            top = sizes[-1] if at < len(sizes) - 1 else (sizes[-2] if len(sizes) > 1 else None)
            new = unplanned if top is None else unplanned - saved + d[g] + max(lb, top)
            if new <= limit:
                chosen[g] = 0
                saved -= d[g]
                del sizes[at]
                peak = new
    return bytes(chosen)


def _evaluate(columns, genomes: Sequence[bytes], grow: bool) -> list[tuple[bytes, tuple[int, float, int]]]:
    """Repair and score a batch of candidates.

    A module-level function of plain data, so a process pool can run it; the result does not
    depend on which worker runs it.
    """
    out = []
    for genome in genomes:
        fixed = _repair(columns, genome, grow)
        out.append((fixed, _score(columns, fixed)))
    return out


class _Evaluator:
    """Evaluates batches of candidates, inline or split in order over an executor's workers."""

    def __init__(self, columns, workers: int, executor) -> None:
        self.columns = columns
        self.workers = workers
        self.executor = executor
        self.count = 0

    def __call__(self, genomes: list[bytes], grow: bool) -> list[tuple[bytes, tuple[int, float, int]]]:
        self.count += len(genomes)
        if self.executor is None or self.workers <= 1 or len(genomes) < 2:
            return _evaluate(self.columns, genomes, grow)
        size = -(-len(genomes) // self.workers)
        chunks = [genomes[k : k + size] for k in range(0, len(genomes), size)]
        futures = [self.executor.submit(_evaluate, self.columns, chunk, grow) for chunk in chunks]
        return [pair for future in futures for pair in future.result()]


def _thresholds(sizes: Sequence[int], tries: int, lb: int) -> list[int]:
    """``tries`` bottleneck thresholds spread by rank over the distinct sizes, none below ``lb``.

    A threshold between two sizes acts like the smaller one, so the distinct sizes (and ``lb``
    itself, which admits everything not above it) are all the thresholds there are.
    """
    levels = sorted({v for v in sizes if v > lb} | ({lb} if any(v <= lb for v in sizes) else set()))
    if len(levels) <= tries:
        return levels
    return sorted({levels[math.ceil((k + 1) * len(levels) / tries) - 1] for k in range(tries)})


def _spawn_pool(workers: int) -> concurrent.futures.Executor:
    # spawn: safe whatever threads the caller (torch) started; the evaluation is plain data.
    return concurrent.futures.ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))


def _columns(chain: Chain, genes: list[int], lb: int, limit: int | None) -> tuple:
    """What :class:`_Evaluator` scores a genome with: the genes' bytes, seconds and sizes, the
    unplanned peak, ``lb``, the limit (0: none) and the genes cheapest seconds per byte first and last."""
    gd = [chain.d[i] for i in genes]
    gs = [chain.s[i] for i in genes]
    gt = [chain.t[i] for i in genes]
    best_first = sorted(range(len(genes)), key=lambda g: (gt[g] / gd[g], -gd[g], g))
    return (gd, gt, gs, chain.unplanned, lb, 0 if limit is None else limit, best_first, best_first[::-1])


def _mutate(genome: bytes, rng: random.Random, n: int) -> bytes:
    """Flip one to three random genes."""
    child = bytearray(genome)
    for g in rng.sample(range(n), min(n, rng.randint(1, 3))):
        child[g] ^= 1
    return bytes(child)


def _breed(population: list[bytes], scored: dict, rng: random.Random, n: int, pool_size: int) -> list[bytes]:
    """One generation's children: tournament selection (of 3), two-point crossover along the
    chain (nine times in ten) and bit-flip mutation."""
    children = []
    for _ in range(pool_size):
        a = min((population[rng.randrange(len(population))] for _ in range(3)), key=lambda g: (scored[g], g))
        b = min((population[rng.randrange(len(population))] for _ in range(3)), key=lambda g: (scored[g], g))
        if n > 1 and rng.random() < 0.9:
            lo, hi = sorted(rng.sample(range(n + 1), 2))
            a = a[:lo] + b[lo:hi] + a[hi:]
        children.append(_mutate(a, rng, n))
    return children


def _evolve(evaluate, firsts: list[bytes], scored: dict, rng: random.Random, n: int, pool_size: int, generations: int):
    """The genetic algorithm from the threshold candidates ``firsts``; its final population,
    best first (``scored`` gains every repaired child's fitness)."""

    def rank(genomes) -> list[bytes]:
        return sorted(set(genomes), key=lambda g: (scored[g], g))[:pool_size]

    population = rank(firsts)
    for _ in range(generations):
        repaired = []
        for genome, key in evaluate(_breed(population, scored, rng, n, pool_size), True):
            scored.setdefault(genome, key)
            repaired.append(genome)
        population = rank(population + repaired)
    return population


def sublinear(
    items: Sequence[Item],
    budget: ByteBudget | None = None,
    config: SublinearConfig = SublinearConfig(),
    *,
    base_bytes: int = 0,
    seed: int = 0,
    executor: concurrent.futures.Executor | None = None,
) -> SublinearResult:
    """Chen et al.'s threshold search refined by a genetic algorithm (MegEngine semantics).

    With per-module regions a "segment" is one module and its recompute memory is its
    ``saved_bytes``, so Chen's memory threshold bounds the bottleneck: threshold b checkpoints
    every module with s <= b that saves bytes (d > 0); under a byte budget, checkpoints are then
    dropped, dearest seconds per byte first, while the estimate stays within it.
    ``thresh_nr_try`` thresholds are tried, spread over the distinct sizes, none below
    ``lb_memory``.  Fitness, lexicographic: bytes over the limit, recompute seconds, estimated
    peak; with no budget the limit is 0, so the search minimises memory first (MegEngine's
    objective).  The bottleneck is never counted below ``lb_memory`` -- memory reserved for
    recompute anyway -- so no candidate wins by making the bottleneck smaller than that.

    The genetic algorithm (``genetic_nr_iter`` generations, ``genetic_pool_size`` candidates)
    starts from the threshold candidates, breeds by tournament selection, two-point crossover
    along the chain and bit-flip mutation, repairs each child (:func:`_repair`) and keeps the
    best distinct candidates of parents and children (elitist), so it is never worse than the
    threshold search.  All randomness comes from ``random.Random(seed)`` in this process;
    candidates are evaluated on ``config.workers`` workers (a spawn process pool, or the given
    ``executor``) in fixed chunks, so the result does not depend on the number of workers.
    """
    chain = Chain(items, base_bytes)
    limit = None if budget is None else byte_limit(budget, chain.unplanned)
    lb = config.lb_memory
    genes = [i for i in range(chain.n) if chain.d[i] > 0]
    n = len(genes)
    gs = [chain.s[i] for i in genes]
    columns = _columns(chain, genes, lb, limit)
    thresholds = _thresholds(gs, config.thresh_nr_try, lb)
    seeds = [bytes(1 if gs[g] <= b else 0 for g in range(n)) for b in thresholds] or [bytes(n)]

    workers = config.workers
    own_pool = None
    if executor is None and workers > 1 and n and config.genetic_nr_iter:
        own_pool = executor = _spawn_pool(workers)
    try:
        evaluate = _Evaluator(columns, workers, executor)
        scored: dict[bytes, tuple[int, float, int]] = {}
        firsts = []
        for genome, key in evaluate(seeds, False):
            scored.setdefault(genome, key)
            firsts.append(genome)
        best_index = min(range(len(firsts)), key=lambda k: (scored[firsts[k]], firsts[k]))
        threshold_best = firsts[best_index]
        generations = config.genetic_nr_iter if n else 0
        population = _evolve(evaluate, firsts, scored, random.Random(seed), n, config.genetic_pool_size, generations)
        evaluations = evaluate.count
    finally:
        if own_pool is not None:
            own_pool.shutdown()

    winner = population[0]
    chosen = [genes[g] for g in range(n) if winner[g]]
    threshold_set = [genes[g] for g in range(n) if threshold_best[g]]
    choice = make_choice(chain, "sublinear", budget, chosen, limit)
    before = Estimate(chain.peak(threshold_set), chain.seconds(threshold_set))
    after = Estimate(choice.estimated_peak, choice.recompute_seconds)
    report = GeneticReport(
        thresholds=tuple(thresholds),
        best_threshold=thresholds[best_index] if thresholds else lb,
        threshold_checkpointed=tuple(threshold_set),
        threshold=before,
        genetic=after,
        improved=scored[winner] < scored[threshold_best],
        seconds_saved=before.seconds - after.seconds,
        bytes_saved=before.peak - after.peak,
        generations=generations,
        evaluations=evaluations,
    )
    return SublinearResult(choice, report)
