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


def torch_matmul_rate(sizes=(512, 1024, 2048), dtype: str = "float32", work: float = 2e10) -> float:
    """The same measurement through torch (the peer's library), on the same host and threads."""
    import os

    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    best = 0.0
    for n in sizes:
        a = torch.randn(n, n).to(getattr(torch, dtype))
        torch.mm(a, a)
        reps = max(3, int(work / (2 * n ** 3)))
        for _ in range(3):
            start = time.perf_counter()
            for _ in range(reps):
                torch.mm(a, a)
            best = max(best, 2 * n ** 3 * reps / (time.perf_counter() - start))
    return best


def cpu_name() -> str:
    """The host's CPU model, from /proc/cpuinfo where there is one."""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or "unknown CPU"
