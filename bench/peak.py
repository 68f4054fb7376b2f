"""The machine's limit, measured in the same run as the throughput it is compared with."""

import time

import jax
import jax.numpy as jnp


def matmul_rate(sizes=(512, 1024, 2048), dtype=jnp.float32, work: float = 2e10) -> float:
    """Best FLOP/s of a jitted square matmul (float32 accumulation) over `sizes`, timing about `work` FLOPs
    per try, three tries each."""
    best = 0.0
    for n in sizes:
        a = jax.random.normal(jax.random.key(0), (n, n), dtype)
        f = jax.jit(lambda x, y: jnp.dot(x, y, preferred_element_type=jnp.float32).astype(dtype))
        f(a, a).block_until_ready()
        reps = max(3, int(work / (2 * n ** 3)))
        for _ in range(3):
            start = time.perf_counter()
            for _ in range(reps):
                out = f(a, a)
            out.block_until_ready()
            best = max(best, 2 * n ** 3 * reps / (time.perf_counter() - start))
    return best
