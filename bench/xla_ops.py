"""What the profile scripts share: which JAX operation each XLA operation of a compiled program came from
(the program's HLO metadata), and each operation's seconds in a `jax.profiler` trace of one call."""

from __future__ import annotations

import collections
import glob
import gzip
import json
import re
import tempfile
from typing import Callable

# the einsum specs of the decoder's weight matmuls (`dcsjax.nn.decoder`), as XLA's operation metadata names them
WEIGHT_MATMULS = ("btd,df->btf", "btf,fd->btd", "btd,dhk->bthk", "bthk,hkd->btd", "bsd,dnk->bsnk")


def origins(compiled) -> dict[str, str]:
    """XLA operation -> the JAX operation it came from (its op_name), in a compiled program
    (`jax.jit(f).lower(...).compile()`)."""
    return {m.group(1): m.group(2)
            for m in re.finditer(r"(?m)^\s*(?:ROOT )?%([\w.\-]+) = \S+ .*?op_name=\"([^\"]*)\"", compiled.as_text())}


def traced_seconds(call: Callable[[], object], keep: Callable[[str], bool]) -> collections.Counter:
    """Seconds per XLA operation in a trace of one `call()`, summed over threads, for the operation names
    `keep` accepts (the trace also holds the runtime's bookkeeping: executors, thread pools)."""
    import jax

    with tempfile.TemporaryDirectory() as trace_dir:
        jax.profiler.start_trace(trace_dir, create_perfetto_trace=True)
        jax.block_until_ready(call())
        jax.profiler.stop_trace()
        (trace,) = glob.glob(f"{trace_dir}/**/perfetto_trace.json.gz", recursive=True)
        events = json.load(gzip.open(trace))["traceEvents"]
    seconds = collections.Counter()
    for e in events:
        name = e.get("name", "")
        if e.get("ph") == "X" and "dur" in e and keep(name):
            seconds[name] += e["dur"] / 1e6
    return seconds
