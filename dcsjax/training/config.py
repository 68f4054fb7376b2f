"""A training run's settings (`TrainConfig`): plain data, importable without jax, so that `dcsjax --help` and
the command-line parser read the defaults without loading the model stack."""

from __future__ import annotations

from dataclasses import dataclass

ARMS = ("ce", "dcs", "dcs+ce")
ADAPTERS = ("top", "lora")
# `train-abstain`'s stages, in order (`experiment.run_experiment`'s `until`); each reads what the ones before it
# kept in the output folder: data (the splits as jsonl), features (the frozen layers and the starting model's
# logits), train (every run of the grid), evaluate (results.json), export (the chosen model as an HF directory),
# report (summary.md and the figures)
STAGES = ("data", "features", "train", "evaluate", "export", "report")


@dataclass(frozen=True)
class TrainConfig:
    arm: str = "dcs+ce"
    seed: int = 0
    steps: int = 200  # optimizer updates
    batch_size: int = 16
    accumulate: int = 1  # micro-batches summed into one update
    learning_rate: float = 1e-4
    warmup_steps: int = 20  # learning-rate warm-up, then cosine decay to a tenth
    weight_decay: float = 0.01
    beta: float = 1.0  # CE weight in "dcs+ce"
    gamma: float = 0.0  # KL-to-start weight
    ce_warmup: int = 50  # "dcs+ce": steps over which the loss hands over from CE to DCS
    lc: float = 1.0
    lw: float = 1.0
    stated: bool = False  # the DCS loss and the dev selection at each item's own lw, the one its prompt states
    eval_every: int = 25
    patience: int = 4  # evaluations without a better dev score (`selection_score`) before stopping
    adapter: str = "top"
    lora_rank: int = 8
    lora_alpha: float = 16.0

    def __post_init__(self) -> None:
        if self.arm not in ARMS:
            raise ValueError(f"arm must be one of {ARMS}, not {self.arm!r}")
        if self.adapter not in ADAPTERS:
            raise ValueError(f"adapter must be one of {ADAPTERS}, not {self.adapter!r}")
