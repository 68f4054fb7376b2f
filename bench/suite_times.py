"""The test suite's time per file and its slowest tests, from the output of a pytest run with
`--durations=0` (as `PYTEST_ADDOPTS=--durations=0 bash .ci/run > ci.log` writes it): where a trim starts.

    python bench/suite_times.py ci.log

Prints Markdown tables: each file's summed test time (setup, call and teardown; with two workers the wall
time is about half the sum) and the slowest tests; the run's own closing line.
"""

from __future__ import annotations

import re
import sys
from collections import Counter

from dcsjax.eval.tables import render

DURATION = re.compile(r"\s*([\d.]+)s (call|setup|teardown)\s+(tests/\S+)")


def main(path: str, top: int = 20) -> None:
    text = open(path).read()
    per_test: Counter = Counter()
    for seconds, _, test in DURATION.findall(text):
        per_test[test] += float(seconds)
    per_file: Counter = Counter()
    for test, seconds in per_test.items():
        per_file[test.split("::")[0]] += seconds
    total = sum(per_file.values())
    print(render(["file", "seconds", "share"], [[f, f"{s:.1f}", f"{s / total:.0%}"] for f, s in per_file.most_common()],
                 "markdown", numeric=(1, 2)))
    print(f"\nsum of the tests' times: {total:.0f} s\n")
    print(render(["test", "seconds"], [[t, f"{s:.1f}"] for t, s in per_test.most_common(top)], "markdown", numeric=(1,)))
    closing = [line.strip("= ") for line in text.splitlines() if re.search(r"\d+ passed", line)]
    if closing:
        print(f"\n{closing[-1]}")


if __name__ == "__main__":
    main(sys.argv[1])
