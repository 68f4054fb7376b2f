"""Every table dcsjax prints or writes, through one function on tabulate: plain text for a terminal,
GitHub Markdown for a report or the README (`--format markdown`)."""

from __future__ import annotations

from typing import Sequence

FORMATS = {"text": "simple", "markdown": "github"}


def render(header: Sequence[str], rows: Sequence[Sequence[object]], fmt: str = "text",
           numeric: Sequence[int] = ()) -> str:
    """Cells are shown as given (already formatted: no re-parsing of "0.50" into 0.5); the columns in
    `numeric` are right-aligned."""
    from tabulate import tabulate

    if fmt not in FORMATS:
        raise ValueError(f"table format must be one of {sorted(FORMATS)}, not {fmt!r}")
    align = ["right" if i in set(numeric) else "left" for i in range(len(header))]
    return tabulate([[str(c) for c in row] for row in rows], headers=list(header), tablefmt=FORMATS[fmt],
                    colalign=align, disable_numparse=True)
