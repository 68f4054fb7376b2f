"""What every bench script shares: the environment it runs in, timing, the machine's measured matmul rate,
the peer (transformers + torch on the same GGUF weights), and the record it writes.

A record (`write_record`) names what made it: the host (CPU, cores, device), the code (dcsjax's version, source
digest and git commit), the libraries, the command line and the time; the script adds its own figures.
"""

import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# the project's cache (models fetched once, offline after), as the tests use it
os.environ.setdefault("DCSJAX_CACHE", str(ROOT / ".cache"))
os.environ.setdefault("HF_HOME", str(ROOT / ".cache" / "huggingface"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
from dcsjax.host import choose_jax_platforms  # noqa: E402  (no jax: it must run before a script imports jax)

choose_jax_platforms()  # as `dcsjax` does: no TPU here, so libtpu is not started (nor its start-up lines printed)


# ---------------------------------------------------------------------------------------------- timing
def timed(fn, repeats: int = 2) -> tuple[float, object]:
    """Best wall time of `repeats` runs after one warm-up (which compiles), and the last result."""
    result = fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def median_seconds(fn, repeats: int, wait=None) -> float:
    """Median wall time of `repeats` runs after one warm-up; `wait` blocks on the result (default: JAX's
    `block_until_ready`, since a jitted call returns before its work is done)."""
    import jax
    import numpy as np

    wait = wait or jax.block_until_ready
    wait(fn())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        wait(fn())
        times.append(time.perf_counter() - start)
    return float(np.median(times))


# ------------------------------------------------------------------------------------------- the host
def matmul_rate(sizes=(512, 1024, 2048), dtype=None, work: float = 2e10) -> float:
    """Best FLOP/s of a jitted square matmul (float32 accumulation) over `sizes`, timing about `work` FLOPs
    per try, three tries each: the machine's limit, measured in the same run as what is compared with it."""
    import jax
    import jax.numpy as jnp

    dtype = dtype or jnp.float32
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


# ------------------------------------------------------------------------------------------- the peer
def reference_dir(name: str) -> Path:
    """transformers' own float32 model of a card's GGUF file, written once as a safetensors directory in the
    cache and read from there after: transformers dequantises a GGUF file in Python (about 13 s for SmolLM2 and
    50 s for Gemma 3 on 2 cores, against 0.5 s for the directory), and every bench run, test worker and reload
    needs it. The tensors are the ones transformers' GGUF loader made, untouched (`tests/test_parity.py`
    checks them against a fresh load); the folder is named by the GGUF file's size and modification time and
    transformers' version, so another file or version writes its own."""
    import shutil

    import torch
    import transformers
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    from dcsjax.checkpoints.fetch import fetch_model

    path = fetch_model(name)
    stat = path.stat()
    folder = (Path(os.environ["DCSJAX_CACHE"]) / "reference"
              / f"{name}-{stat.st_size}-{int(stat.st_mtime)}-transformers-{transformers.__version__}")
    if (folder / "model.safetensors").is_file():
        return folder
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    tmp = folder.with_name(f"{folder.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    config = model.config.to_dict()
    config.pop("quantization_config", None)  # transformers will not `save_pretrained` a GGUF-loaded model
    (tmp / "config.json").write_text(json.dumps(config))
    model.generation_config.save_pretrained(tmp)
    # tied matrices are separate copies on disk (safetensors refuses shared storage); tied again on load
    save_file({k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}, str(tmp / "model.safetensors"))
    try:
        tmp.rename(folder)  # whole or absent: a second process that wrote it first wins
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


class Peer:
    """The peer: transformers + torch on the same GGUF file, as lm-eval's HF backend scores (right-padded
    batches, full logits, log_softmax, gather)."""

    def __init__(self, name: str, dtype: str = "float32"):
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(os.cpu_count() or 1)
        self.torch = torch
        torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
        self.model = AutoModelForCausalLM.from_pretrained(reference_dir(name), dtype=torch_dtype).eval()

    def token_logprobs(self, ids: list[list[int]], batch_size: int, sort: bool = True) -> list:
        """Per id list, the float32 log-probs of its tokens after the first."""
        torch = self.torch
        order = sorted(range(len(ids)), key=lambda i: -len(ids[i])) if sort else list(range(len(ids)))
        out: list = [None] * len(ids)
        with torch.inference_mode():
            for s in range(0, len(order), batch_size):
                chunk = order[s:s + batch_size]
                width = max(len(ids[i]) for i in chunk)
                x = torch.zeros((len(chunk), width), dtype=torch.long)
                mask = torch.zeros_like(x)
                for r, i in enumerate(chunk):
                    x[r, :len(ids[i])] = torch.tensor(ids[i])
                    mask[r, :len(ids[i])] = 1
                logits = self.model(input_ids=x, attention_mask=mask).logits
                lp = torch.log_softmax(logits.float(), -1)[:, :-1].gather(2, x[:, 1:, None])[..., 0]
                for r, i in enumerate(chunk):
                    out[i] = lp[r, :len(ids[i]) - 1].numpy()
        return out


# ------------------------------------------------------------------------------------------ the record
def write_record(out: str | Path, stem: str, record: dict, arguments=None) -> Path:
    """`record` written as `out/stem-<time>.json`, with what made it: the host, the code and libraries
    (`dcsjax.eval.results.environment`), torch's version where the run used it, the arguments and the command."""
    import jax

    from dcsjax.eval.results import environment

    made_by = {"cpu": cpu_name(), "cores": os.cpu_count(), "device": jax.devices()[0].device_kind,
               "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "environment": environment(),
               "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
               "arguments": vars(arguments) if arguments is not None else None}
    if "torch" in sys.modules:
        made_by["torch"] = sys.modules["torch"].__version__
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps({**made_by, **record}, indent=1))
    return path
