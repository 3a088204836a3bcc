"""The tail store of benchmarks/bench_remote.py serves the distribution issue 26 names (median
20 ms, p99 404 ms, 0.5% at 3 s): by default every 2,000 requests draw each of 2,000 evenly
spaced quantiles once, so a run's store has that distribution exactly rather than a sample of
it (the fixed seed's 2,000 independent draws have a p99 of 518 ms)."""

from __future__ import annotations

from benchmarks import bench_remote
from benchmarks.bench_remote import STRATA, TAIL_SLOW, _Store


def served(draws: str, n: int) -> list[float]:
    store = _Store(draws)
    return sorted(store.delay("tail") for _ in range(n))


def test_each_block_of_stratified_delays_has_the_issues_distribution() -> None:
    for blocks in (1, 2):
        delays = served("stratified", blocks * STRATA)
        n = len(delays)
        assert delays.count(TAIL_SLOW) == n // 200  # 0.5% at 3 s
        assert 0.019 <= delays[n // 2] <= 0.021  # median 20 ms
        assert 0.400 <= delays[int(0.99 * n)] <= 0.416  # p99 404 ms (the next stratum: 413)


def test_the_store_reports_the_p99_of_the_delays_it_served() -> None:
    store = _Store("stratified")
    for _ in range(STRATA):
        store.delay("tail")
    assert store.counts()["p99"] == served("stratified", STRATA)[int(0.99 * STRATA)]
    assert store.delay("plain") == bench_remote.LATENCY
    assert len(store.served) == STRATA  # only the tail's delays are counted


def test_independent_draws_from_the_fixed_seed_are_a_harsher_sample() -> None:
    delays = served("iid", STRATA)
    assert delays[int(0.99 * STRATA)] > 0.5  # what rows measured before the strata: 518 ms


def test_a_row_over_its_passes_is_the_median_of_each_figure() -> None:
    rows = [bench_remote.Result("tail", "r", rate, req, 0, 0.02, p99, store_p99=0.4)
            for rate, req, p99 in [(2000.0, 2100, 0.31), (1500.0, 2200, 0.25),
                                   (2500.0, 2150, 0.28)]]
    mid = bench_remote.median_result(rows)
    assert (mid.rate, mid.requests, mid.p99) == (2000.0, 2150, 0.28)
    failed = bench_remote.Result("tail", "r", None, 10, 0, 0, 0, "failed: boom")
    assert bench_remote.median_result([*rows, failed]) is failed  # a failed pass fails the row
