"""Metrics over per-item results: DCS's calibration companions, the loading spectrum, bootstrap intervals.

The DCS kernel itself lives in `dcsjax.metrics.dcs`; what is here reads a batch of items' option+IDK
distributions (`Distributions`) and aggregates them.
"""

from dcsjax.metrics.bootstrap import Interval, PairedInterval, bootstrap_ci, mean_ci, paired_bootstrap
from dcsjax.metrics.calibration import (
    ABSTENTION_METRICS,
    DEFAULT_THRESHOLDS,
    Distributions,
    aurc,
    brier_score,
    ece,
    forced_answer,
    loading_spectrum,
    risk_coverage,
    selective_accuracy,
    ternary_score,
)

__all__ = ["ABSTENTION_METRICS", "DEFAULT_THRESHOLDS", "Distributions", "Interval", "PairedInterval", "aurc", "bootstrap_ci", "brier_score",
           "ece", "forced_answer", "loading_spectrum", "mean_ci", "paired_bootstrap", "risk_coverage",
           "selective_accuracy", "ternary_score"]
