"""The app soak's leak judge: a slope per 1000 replies over every sample, each stretch between reloads at its
own level, and the mean step across a reload."""
from __future__ import annotations

import random
import statistics

from tests.app.soak_meter import growth_split

REPLIES = range(125, 501, 10)  # the long run's warm-up and samples
RELOADS = [150, 300, 450]


def samples(leak_per_1000: float, reload_step: float, noise: float, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for n in REPLIES:
        level = 1600 + leak_per_1000 * n / 1000 + reload_step * sum(r < n for r in RELOADS)
        out.append({"replies": n, "rss": level + rng.uniform(-noise, noise)})
    return out


def test_a_steady_leak_is_measured_through_sample_noise_and_reload_steps():
    """Samples that swing +-3 MB: the slope over all of them is unbiased and its spread far below the 20 MB
    bound; the sum of first-to-last differences per stretch had twice the spread (~15 MB per 1000)."""
    runs = [growth_split(samples(20.0, 15.0, noise=3.0, seed=seed), RELOADS, "rss") for seed in range(50)]
    between = [b for b, _ in runs]
    assert abs(statistics.mean(between) - 20.0) < 3.0
    assert statistics.stdev(between) < 10.0
    assert all(abs(step - 15.0) < 6.0 for _, step in runs)


def test_no_leak_reads_near_zero_and_reload_steps_are_not_counted_as_growth():
    between, step = growth_split(samples(0.0, 20.0, noise=0.0), RELOADS, "rss")
    assert abs(between) < 1e-9 and abs(step - 20.0) < 1e-9
    between, _ = growth_split(samples(40.0, 0.0, noise=0.0), RELOADS, "rss")
    assert abs(between - 40.0) < 1e-9  # exact without noise
