"""The package's folders are its layers and imports run one way, down: checkpoint -> model -> engine ->
protocol -> results -> report (README, Architecture). An import back up would be a cycle waiting to happen."""

import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "dcsjax"
# lowest first; a module may import from its own layer and the ones before it
LAYERS = ["host", "errors", "cache", "nn", "checkpoints", "engine", "data", "metrics", "eval", "statements", "analysis", "training",
          "lmeval", "cli", "__main__", "__init__"]


def test_imports_only_go_down_the_layers():
    rank = {name: i for i, name in enumerate(LAYERS)}
    upward = []
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).parts
        layer = parts[0] if len(parts) > 1 else path.stem
        assert layer in rank, f"{path}: a folder or module that README's architecture does not place"
        for target in re.findall(r"^\s*(?:from|import) dcsjax\.(\w+)", path.read_text(), re.M):
            if rank[target] > rank[layer]:
                upward.append(f"{path.relative_to(PACKAGE)} imports dcsjax.{target}")
    assert not upward, upward
