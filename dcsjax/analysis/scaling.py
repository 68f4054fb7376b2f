"""Scaling curves of accuracy against model size (paper 002 §3): fit, select by AIC, bootstrap bands,
and the prompting break-even size where APX overtakes APS.

Sizes enter as x = log10(parameters), centred on the data's mean (so every family is well conditioned).
Each family is monotonic in x over the data's range; a fit whose rational curve has a pole inside the
range is rejected. AIC = n ln(RSS / n) + 2k, from the residual sum of squares as in the paper.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
from scipy.optimize import brentq, least_squares

from dcsjax.metrics.bootstrap import resample_indices  # models resampled as items are

Curve = Callable[..., np.ndarray]

# name -> (curve of centred x and parameters, starting points as functions of (x, y))
FAMILIES: dict[str, tuple[Curve, Callable[[np.ndarray, np.ndarray], list[list[float]]]]] = {
    "log-linear": (lambda x, a, b: a + b * x,
                   lambda x, y: [[y.mean(), 0.0]]),
    "power": (lambda x, a, b, c: a - b * np.exp(-c * x),  # saturating power law a - b' N^-c', in log10 N
              lambda x, y: [[y.max(), y.max() - y.mean(), s] for s in (0.3, 1.0, 3.0)]
              + [[y.min(), y.min() - y.mean(), -s] for s in (0.3, 1.0, 3.0)]),
    "rational": (lambda x, a, b, c: (a + b * x) / (1 + c * x),
                 lambda x, y: [[y.mean(), 0.0, c] for c in (-0.3, 0.0, 0.3)]),
    "logistic": (lambda x, a, b, c: a / (1 + np.exp(-b * (x - c))),
                 lambda x, y: [[max(y.max(), 1e-3) * m, s, c] for m in (1.0, 1.3) for s in (-3.0, 1.0, 3.0)
                               for c in np.quantile(x, [0.25, 0.5, 0.75])]),
}


def n_params(family: str) -> int:
    """Free parameters of a family: its curve's arguments after x."""
    return FAMILIES[family][0].__code__.co_argcount - 1


@dataclass(frozen=True)
class Fit:
    family: str
    params: tuple[float, ...]
    rss: float
    aic: float
    n: int
    centre: float  # the mean log10 size the curve is centred on

    def __call__(self, log10_size) -> np.ndarray:
        return FAMILIES[self.family][0](np.asarray(log10_size, np.float64) - self.centre, *self.params)


def _fit_family(family: str, x: np.ndarray, y: np.ndarray, centre: float) -> Fit | None:
    curve, starts = FAMILIES[family]
    xc = x - centre
    best = None
    for p0 in starts(xc, y):
        try:
            with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # wild trial steps are fine
                result = least_squares(lambda p: curve(xc, *p) - y, p0, method="lm")
        except (ValueError, RuntimeError):
            continue
        if not result.success or not np.all(np.isfinite(result.x)):
            continue
        if family == "rational":
            c = result.x[2]
            ends = 1 + c * np.array([xc.min(), xc.max()])
            if ends[0] * ends[1] <= 0:  # a pole inside the data: not a monotonic curve there
                continue
        rss = float(np.sum(result.fun ** 2))
        if best is None or rss < best[1]:
            best = (tuple(map(float, result.x)), rss)
    if best is None:
        return None
    n, k = len(x), len(best[0])
    aic = n * np.log(max(best[1], 1e-300) / n) + 2 * k
    return Fit(family, best[0], best[1], float(aic), n, centre)


def fit_curves(log10_size, accuracy, families=tuple(FAMILIES)) -> list[Fit]:
    """Every family that can be fitted (more points than parameters), best AIC first."""
    x, y = np.asarray(log10_size, np.float64), np.asarray(accuracy, np.float64)
    centre = float(x.mean())
    fits = [f for name in families if len(x) > n_params(name) and (f := _fit_family(name, x, y, centre)) is not None]
    return sorted(fits, key=lambda f: f.aic)


def bootstrap_band(log10_size, accuracy, family: str, grid, n_boot: int = 1000, seed: int = 0,
                   level: float = 0.95) -> tuple[np.ndarray, np.ndarray, int]:
    """Pointwise percentile band of one family's curve over `grid`, resampling models with replacement.
    Returns (low, high, resamples that could be fitted)."""
    x, y = np.asarray(log10_size, np.float64), np.asarray(accuracy, np.float64)
    curves = []
    for idx in resample_indices(len(x), n_boot, seed):
        if len(np.unique(x[idx])) <= n_params(family):
            continue  # too few distinct sizes to fit this family
        fit = _fit_family(family, x[idx], y[idx], float(x.mean()))
        if fit is not None:
            curves.append(fit(grid))
    curves = np.array(curves)
    tail = 100 * (1 - level) / 2
    return np.percentile(curves, tail, axis=0), np.percentile(curves, 100 - tail, axis=0), len(curves)


def crossing(upper: Fit, lower: Fit, lo: float, hi: float, steps: int = 400) -> float | None:
    """The first log10 size in [lo, hi] where `upper` rises from below `lower` to above it, if any."""
    grid = np.linspace(lo, hi, steps)
    gap = upper(grid) - lower(grid)
    for i in np.flatnonzero((gap[:-1] < 0) & (gap[1:] >= 0)):
        return float(brentq(lambda g: float(upper(g) - lower(g)), grid[i], grid[i + 1]))
    return None


@dataclass(frozen=True)
class BreakEven:
    """The interval is taken over every resample: one whose curves do not cross inside the sizes counts
    as crossing below them (APX already ahead at the smallest) or beyond them (still behind at the largest),
    so an end of the interval can be open (-inf or inf); `crossed` says how many crossed inside."""
    log10_size: float | None  # on all models; None where the curves do not cross in the range
    low: float | None  # -inf: below the smallest size; None: no resample could be fitted
    high: float | None  # inf: beyond the largest size
    crossed: float  # share of bootstrap resamples in which the curves cross inside the sizes
    aps: Fit
    apx: Fit
    resamples: int = 0

    def describe(self, scale=lambda v: f"{10 ** v:.3g}") -> str:
        """"at 1.2e+09 parameters (95% CI 8e+08 to beyond the largest model; 41% of 500 resamples cross)"."""
        def end(v):
            return ("below the smallest model" if v == -np.inf else "beyond the largest model" if v == np.inf
                    else "?" if v is None else scale(v))
        where = "no crossing within the sizes" if self.log10_size is None else f"at {scale(self.log10_size)} parameters"
        return (f"{where} (95% CI {end(self.low)} to {end(self.high)}; {self.crossed:.0%} of {self.resamples} "
                "resamples cross within the sizes" + (", so the interval is open-ended" if np.isinf([
                    self.low or 0, self.high or 0]).any() else "") + ")")


def break_even(log10_size, aps, apx, n_boot: int = 1000, seed: int = 0, level: float = 0.95,
               span: tuple[float, float] | None = None) -> BreakEven:
    """Where APX overtakes APS. Each metric gets its AIC-best family on all models; the interval resamples
    models (the same models for both metrics, since they are scored on the same items) and refits those
    families. Searched over `span` (default: the range of the sizes)."""
    x = np.asarray(log10_size, np.float64)
    aps, apx = np.asarray(aps, np.float64), np.asarray(apx, np.float64)
    lo, hi = span or (float(x.min()), float(x.max()))
    fit_aps, fit_apx = fit_curves(x, aps)[0], fit_curves(x, apx)[0]
    point = crossing(fit_apx, fit_aps, lo, hi)
    where = []  # per resample: the crossing, or -inf / inf where it lies outside the sizes
    centre = float(x.mean())
    for idx in resample_indices(len(x), n_boot, seed):
        f_aps = _fit_family(fit_aps.family, x[idx], aps[idx], centre)
        f_apx = _fit_family(fit_apx.family, x[idx], apx[idx], centre)
        if f_aps is None or f_apx is None:
            continue
        c = crossing(f_apx, f_aps, lo, hi)
        where.append(c if c is not None else -np.inf if f_apx(np.array([lo]))[0] >= f_aps(np.array([lo]))[0] else np.inf)
    tail = (1 - level) / 2
    low, high = ((float(v) for v in np.quantile(where, [tail, 1 - tail], method="inverted_cdf")) if where
                 else (None, None))
    crossed = sum(np.isfinite(where)) / len(where) if where else 0.0
    return BreakEven(point, low, high, crossed, fit_aps, fit_apx, len(where))
