"""The multi-process path on this machine: two local processes joined by `jax.distributed` (gloo on CPU),
each scoring its share of the items; process 0 writes files identical to a single process's."""

import pytest
import os
import socket
import subprocess
import sys

from conftest import UNKNOWNS, UNKNOWNS_CARD, scorer_for
from dcsjax.eval.run import run_eval

pytestmark = pytest.mark.slow

TASK, PROTOCOLS, LIMIT = UNKNOWNS_CARD, ["qa-ppl", "dcs", "apx"], 10


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def files(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*.jsonl"))}


def test_two_processes_write_what_one_process_writes(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    run_eval("smollm2-135m-instruct", [TASK], PROTOCOLS, one, limit=LIMIT, chunk=4,
             scorer=scorer_for("smollm2-135m-instruct"), progress=False)
    port = free_port()
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    command = [sys.executable, "-m", "dcsjax", "eval", "--model", "smollm2-135m-instruct", "--tasks", TASK,
               "--protocols", ",".join(PROTOCOLS), "--limit", str(LIMIT), "--output", str(two),
               "--coordinator", f"localhost:{port}", "--num-processes", "2"]
    procs = [subprocess.Popen([*command, "--process-id", str(k)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for k in (0, 1)]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    assert UNKNOWNS in outs[0][0] and UNKNOWNS not in outs[1][0]  # only process 0 prints the table
    assert files(two) == files(one) and len(files(one)) == len(PROTOCOLS) + 1  # + errors.jsonl
