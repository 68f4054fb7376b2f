"""What this host has, read before JAX starts, and libtpu kept quiet where there is no TPU.

libtpu comes with the `tpu` and `test` extras (`dcsjax plan` compiles for TPU slices through it). On a host with
no TPU, JAX's default platform search still starts it, and it prints why it cannot find this host's TPU (host
bounds, worker hostnames, a source-location trace) on every command: true, beside the point, and read as a
failure. So where no TPU device is present and the user has not set `JAX_PLATFORMS`, JAX is told to start its
CPU backend alone (hosts with a GPU device are left to JAX's own search); `dcsjax plan`, which loads libtpu on
purpose to compile for a topology, drops those start-up lines (`libtpu_start_up_dropped`) and passes on the rest.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import sys
import tempfile
from collections.abc import Iterator

# TPU VMs expose their chips as /dev/accel* (v2-v4) or /dev/vfio/<n> (v5e and later); GPUs as /dev/nvidia<n>
# (CUDA) or /dev/kfd (ROCm)
TPU_DEVICES = ("/dev/accel*", "/dev/vfio/[0-9]*")
GPU_DEVICES = ("/dev/nvidia[0-9]*", "/dev/kfd")
# what libtpu prints when it starts on a host without a TPU
LIBTPU_START_UP = re.compile(r"host bounds|TPU accelerator type|InitGoogle|TPU_WORKER_HOSTNAMES|worker hostname|"
                             r"Source Location Trace|libtpu_init_utils|^\S+\.cc:\d+\s*$")


def has_any(patterns: tuple[str, ...]) -> bool:
    return any(glob.glob(pattern) for pattern in patterns)


def choose_jax_platforms() -> None:
    """`JAX_PLATFORMS=cpu` where the host has no TPU and no GPU device and the user set none: JAX then never
    starts libtpu for a chip that is not there. A TPU or GPU host keeps JAX's own search."""
    if "JAX_PLATFORMS" not in os.environ and not has_any(TPU_DEVICES) and not has_any(GPU_DEVICES):
        os.environ["JAX_PLATFORMS"] = "cpu"


@contextlib.contextmanager
def libtpu_start_up_dropped() -> Iterator[None]:
    """While libtpu loads to compile for a TPU topology on a host without one: its start-up lines (C++ writes them
    to the process's file descriptors, so they are caught there) are dropped, and anything else it prints is
    passed on to stderr."""
    if has_any(TPU_DEVICES):  # a real TPU host: what libtpu says there may matter
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
            sink.seek(0)
            kept = [line for line in sink.read().decode(errors="replace").splitlines()
                    if line.strip() and not LIBTPU_START_UP.search(line)]
            if kept:
                print("\n".join(kept), file=sys.stderr)
