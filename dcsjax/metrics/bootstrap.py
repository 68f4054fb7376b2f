"""Percentile bootstrap over items, for any statistic of a batch of items, and its paired form.

`data` is any pytree whose leaves have the items on their first axis (an array of per-item values, a
`Distributions`). The resamples are drawn with a seeded numpy generator, so an interval is reproducible,
and the statistic is vmapped over them in chunks, so ECE or AURC over a thousand resamples is one
compiled call rather than a Python loop.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

Statistic = Callable[[Any], jax.Array]


class Interval(NamedTuple):
    estimate: float
    low: float
    high: float


class PairedInterval(NamedTuple):
    difference: float  # statistic(a) - statistic(b) on all items
    low: float
    high: float
    p_value: float  # two-sided: twice the smaller share of resampled differences on either side of 0


def _n_items(data) -> int:
    sizes = {leaf.shape[0] for leaf in jax.tree.leaves(data)}
    if len(sizes) != 1:
        raise ValueError(f"every leaf must have the items on its first axis; got first axes {sorted(sizes)}")
    return sizes.pop()


def resample_indices(n: int, n_boot: int = 1000, seed: int = 0) -> np.ndarray:
    """[n_boot, n] item indices drawn with replacement."""
    return np.random.default_rng(seed).integers(0, n, (n_boot, n))


def percentile_interval(stats: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """The central `level` percentile interval of resampled statistics [n_boot] (NaN resamples, which had no
    items of a kind, left out)."""
    stats = np.asarray(stats, np.float64)
    stats = stats[np.isfinite(stats)]
    tail = 100 * (1 - level) / 2
    low, high = np.percentile(stats, [tail, 100 - tail])
    return float(low), float(high)


# Jitted with the statistic as a static argument, so a statistic compiles once per shape of its data; a fresh
# closure each call (as `lax.map` alone makes) compiled the same program again every time: 34 times in one report.
@functools.partial(jax.jit, static_argnums=0)
def _resampled_stats(statistic: Statistic, data, indices: jax.Array) -> jax.Array:  # indices [n_boot, n] -> [n_boot]
    return jax.lax.map(lambda idx: statistic(jax.tree.map(lambda x: x[idx], data)), indices, batch_size=64)


@functools.partial(jax.jit, static_argnums=0)
def _on_all(statistic: Statistic, data) -> jax.Array:
    return statistic(data)


def _resampled(statistic: Statistic, data, indices: np.ndarray) -> np.ndarray:
    return np.asarray(_resampled_stats(statistic, jax.tree.map(jnp.asarray, data), jnp.asarray(indices)), np.float64)


def value_and_resamples(statistic: Statistic, data, indices: np.ndarray) -> tuple[float, np.ndarray]:
    """The statistic on all items and on each resample `indices` [n_boot, n] (given, so that several models or
    seeds can share them): the pieces of `bootstrap_ci` for a caller that pools them itself."""
    return float(_on_all(statistic, jax.tree.map(jnp.asarray, data))), _resampled(statistic, data, indices)


def bootstrap_ci(statistic: Statistic, data, n_boot: int = 1000, seed: int = 0, level: float = 0.95) -> Interval:
    """The statistic on all items and its percentile interval over resamples of the items."""
    n = _n_items(data)
    if n == 0:
        return Interval(float("nan"), float("nan"), float("nan"))
    stats = _resampled(statistic, data, resample_indices(n, n_boot, seed))
    low, high = percentile_interval(stats, level)
    return Interval(float(_on_all(statistic, jax.tree.map(jnp.asarray, data))), low, high)


def paired_bootstrap(statistic: Statistic, a, b, n_boot: int = 1000, seed: int = 0,
                     level: float = 0.95) -> PairedInterval:
    """statistic(a) - statistic(b) for two models (or protocols) on the same items, in the same order: each
    resample takes the same items from both, so what the items share cancels out of the interval."""
    n = _n_items(a)
    if _n_items(b) != n:
        raise ValueError(f"paired bootstrap needs the same items on both sides: {n} against {_n_items(b)}")
    indices = resample_indices(n, n_boot, seed)
    diffs = _resampled(statistic, a, indices) - _resampled(statistic, b, indices)
    low, high = percentile_interval(diffs, level)
    p = 2 * min(np.mean(diffs <= 0), np.mean(diffs >= 0))
    estimate = float(_on_all(statistic, jax.tree.map(jnp.asarray, a)) - _on_all(statistic, jax.tree.map(jnp.asarray, b)))
    return PairedInterval(estimate, low, high, float(min(p, 1.0)))


def mean_ci(values, n_boot: int = 1000, seed: int = 0) -> Interval:
    """The mean of per-item values and its 95% percentile interval."""
    return bootstrap_ci(jnp.mean, np.asarray(values, np.float64), n_boot, seed)
