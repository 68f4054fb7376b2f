"""Past one host: several processes, each scoring its share of the items on its own devices, the results
gathered in item order.

Scoring is data-parallel across processes: process k takes items k, k + P, k + 2P, ... of every chunk,
scores them with its local devices (optionally on a local mesh), and the records are all-gathered over
JAX's distributed runtime (no shared file system needed); process 0 writes the files. Because a score does
not depend on which items share a batch, the gathered results equal a single process's bit for bit.

Start every process with the same command plus its coordinates (see the README for GPU hosts and TPU
slices): `dcsjax eval ... --coordinator HOST:PORT --num-processes P --process-id K`. On TPU pods and under
SLURM, JAX finds these itself and the flags can be left out.
"""

from __future__ import annotations

import json
from typing import Any, Sequence, TypeVar

import jax
import numpy as np

T = TypeVar("T")


def initialize(coordinator: str | None = None, num_processes: int | None = None,
               process_id: int | None = None) -> None:
    """Join the run. On CPU, cross-process collectives go through gloo."""
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator, num_processes, process_id)


def rank() -> int:
    return jax.process_index()


def world() -> int:
    return jax.process_count()


def my_share(items: Sequence[T]) -> list[T]:
    """This process's items: every world()-th, starting at its rank."""
    return list(items[rank()::world()])


def gather(local: Any) -> list[Any]:
    """Every process's JSON-able `local`, in rank order, on every process."""
    from jax.experimental import multihost_utils

    if world() == 1:
        return [local]
    data = np.frombuffer(json.dumps(local).encode(), np.uint8)
    sizes = multihost_utils.process_allgather(np.array([data.size], np.int64)).reshape(-1)
    padded = np.zeros(int(sizes.max()), np.uint8)
    padded[:data.size] = data
    everything = multihost_utils.process_allgather(padded).reshape(world(), -1)
    return [json.loads(bytes(row[:n])) for row, n in zip(everything, sizes)]


def gather_in_order(local: list, n: int) -> list:
    """Undo `my_share`: the gathered per-process lists interleaved back into item order."""
    parts = gather(local)
    return [parts[i % world()][i // world()] for i in range(n)]


def from_rank0(value: Any) -> Any:
    """Process 0's `value` on every process."""
    return gather(value)[0]
