"""Sharded scoring on meshes of 8 simulated CPU devices, in a process of their own, against one device:
SmolLM2 on 2x4; the rules table; the vocabulary never gathered by the log-prob kernel; the TPU paths (splash,
routed experts) under shard_map.

The other shapes are run on the tiny checkpoints of test_architectures.py, on 2x4 and the data-only 8x1 mesh
(the batch split, every weight replicated): Gemma 2's local layers and soft caps, Qwen3's q/k norms, the MoE's
experts split over the model axis. Gemma 3's real weights on 2x4 added nothing those do not check but its
vocabulary's split, which falls on the log-prob kernel's chunk boundaries (65,536 rows a device) where
SmolLM2's does not (12,288): SmolLM2's is the split that can gather, and its control shows it would."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import F32_NATS
from dcsjax.engine.packing import batch_heights, rows_per_batch
from dcsjax.nn.sharding import RULES, make_mesh, partition_spec


@pytest.fixture(scope="module")
def mesh_results():
    env = {**os.environ, "JAX_NUM_CPU_DEVICES": "8", "JAX_PLATFORMS": "cpu"}
    script = Path(__file__).with_name("mesh_check.py")
    out = subprocess.run([sys.executable, str(script), "smollm2-135m-instruct@2x4"], env=env,
                         capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, (out.returncode, out.stderr[-3000:])
    results = {r["model"]: r for r in map(json.loads, out.stdout.strip().splitlines())}
    for r in results.values():
        print(json.dumps(r))
    return results


@pytest.mark.slow
def test_mesh_scores_equal_one_device(mesh_results):
    r = mesh_results["smollm2-135m-instruct"]
    assert r["devices"] == 8
    assert r["2x4"]["max_diff"] < F32_NATS, r["2x4"]["max_diff"]
    # 2x4: the vocabulary is split four ways, each device holding a quarter of the embedding rows
    assert r["2x4"]["embed_spec"] == "P('model', None)" and r["2x4"]["embed_shard_rows"] == r["vocab"] // 4
    assert r["2x4"]["rows_per_batch_multiple_of_data"] == 2


@pytest.mark.slow
def test_vocabulary_split_is_never_gathered(mesh_results):
    """No all-gather in the compiled kernel has a dimension of half the vocabulary or more. The control,
    the one-device kernel on the same sharded matrix, does gather it for SmolLM2, whose 12,288 rows per
    device do not fall on 8,192-row chunk boundaries: the check can fail."""
    r = mesh_results["smollm2-135m-instruct"]
    assert r["2x4"]["gathered_vocab_sized"] == []
    assert r["2x4"]["control_gathered"], "the control should gather the vocabulary"


@pytest.mark.slow
def test_eval_on_a_mesh_matches_one_device(mesh_results):
    """Every protocol through `dcsjax eval --mesh 2x4`, APX's KV-cache decode loop included."""
    r = mesh_results["smollm2-135m-instruct"]["eval"]
    assert r["dcs_max_diff"] < 1e-4 and r["mcqa_max_diff"] < 1e-4 and r["apx_same_generations"]


@pytest.mark.slow
def test_splash_under_shard_map_equals_the_dense_path(mesh_results):
    """The TPU long-row kernel on a 2x4 mesh (interpret mode): KV heads split over model (4 of them); query heads
    split, each device slicing its KV head (2 KV heads of 4 queries, as Llama-3.1-70B's 8 of 8 on 16 devices);
    all heads on every device where neither divides (2 KV heads of 3 queries)."""
    r = mesh_results["smollm2-135m-instruct"]["splash"]
    assert max(r.values()) < 1e-5 and len(r) == 3, r


@pytest.mark.slow
def test_routed_experts_on_a_mesh_equal_dense_experts(mesh_results):
    """The MoE's TPU path on a 2x4 mesh (two experts a model device, the pairs routed elsewhere left to their
    devices, the sums added across `model`) against every expert computed on one device."""
    assert mesh_results["smollm2-135m-instruct"]["routed_experts_max_diff"] < 1e-5


def test_rules_replicate_what_the_mesh_does_not_divide():
    class FakeMesh:  # partition_spec reads only the axis sizes
        shape = {"data": 2, "model": 4}

    assert RULES["vocab"] == "model" and RULES["batch"] == "data"
    assert tuple(partition_spec(("vocab", "embed"), (49152, 576), FakeMesh())) == ("model", None)
    # SmolLM2's 9 query heads do not split over 4 devices: their head size (64) does; its MLP width (1536) too
    assert tuple(partition_spec(("layers", "embed", "heads", "head_dim"), (30, 576, 9, 64), FakeMesh())) == (
        None, None, None, "model")
    assert tuple(partition_spec(("layers", "embed", "heads", "head_dim"), (30, 576, 9, 66), FakeMesh())) == (
        None, None, None, None)  # nothing divides: replicated
    assert tuple(partition_spec(("layers", "embed", "mlp"), (30, 576, 1536), FakeMesh())) == (None, None, "model")


def test_mesh_errors_and_row_multiples():
    assert make_mesh(None) is None
    with pytest.raises(ValueError, match="needs 8 devices"):
        make_mesh("2x4")  # this process has one CPU device
    with pytest.raises(ValueError, match="data x model"):
        make_mesh("2x2x2")
    assert rows_per_batch(64, 16, 16384, 8) == 16 and rows_per_batch(4096, 16, 16384, 8) == 8
    assert rows_per_batch(64, 6, None, 4) == 8
    # a short last batch halves down to the data axis, never below it
    assert batch_heights(64, 16, 16384, 8) == (16, 8) and batch_heights(64, 6, None, 4) == (8, 4)
    assert batch_heights(64, 16, 16384, 1) == (16, 8, 4, 2, 1)
