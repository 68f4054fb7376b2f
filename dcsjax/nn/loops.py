"""The engine's loops (`scan`, `map`), and the switch that unrolls them for XLA's cost model.

Layers, vocabulary chunks, token blocks, attention tiles and routing chunks run as loops (and dead
attention tiles are skipped by `cond`) so that compile
time and memory do not grow with their count. XLA's cost analysis counts a loop's body once, whatever its
trip count (a Llama-3.1-8B scoring step compiled for TPU counts 1/23 of its FLOPs), so `dcsjax plan`
(`engine/plan.py`) compiles the same functions again under `unrolled()`, where every loop is written out,
at one and two periods of layers, and scales the difference to the model's depth. Outside `unrolled()`
these are `jax.lax.scan` and `jax.lax.map` exactly (the programs, and their bits, are unchanged).

The switch is read while a function is traced: a jitted function already traced outside it keeps its
loops, so the plan traces through a fresh `jax.jit` of the same Python function.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Callable, Iterator

import jax

_unroll = contextvars.ContextVar("dcsjax_unroll_loops", default=False)


@contextlib.contextmanager
def unrolled() -> Iterator[None]:
    """Trace every loop of the engine fully unrolled (for cost analysis only: compile time grows with trips)."""
    token = _unroll.set(True)
    try:
        yield
    finally:
        _unroll.reset(token)


def scan(f: Callable, init, xs, length: int | None = None):
    """`jax.lax.scan`; written out under `unrolled()`."""
    return jax.lax.scan(f, init, xs, length=length, unroll=True if _unroll.get() else 1)


def cond(pred, true_fn: Callable, false_fn: Callable, operand):
    """`jax.lax.cond`; under `unrolled()` both branches are computed and one selected, since XLA's TPU cost
    model gives a conditional no estimate (each counts -1 s in `optimal_seconds`): the plan's cost then
    includes the work a skipped branch would not do (attention tiles outside every mask)."""
    if _unroll.get():
        import jax.numpy as jnp

        return jax.tree.map(lambda a, b: jnp.where(pred, a, b), true_fn(operand), false_fn(operand))
    return jax.lax.cond(pred, true_fn, false_fn, operand)


def map(f: Callable, xs):  # noqa: A001 (lax.map's name)
    """`jax.lax.map`; written out under `unrolled()`."""
    if _unroll.get():
        return scan(lambda carry, x: (carry, f(x)), None, xs)[1]
    return jax.lax.map(f, xs)
