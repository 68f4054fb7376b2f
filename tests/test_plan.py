"""`dcsjax plan`: the engine's scoring and decoding programs compiled for a TPU slice (`v5e:2x2`, through libtpu,
which the test extra installs) on a (2, 2) mesh, their memory and cost analyses read; the plan's FLOPs against
the analytic count and against XLA's count of the whole program; the unrolled programs compute what the
engine's loops compute."""

import dataclasses
import json

import numpy as np
import pytest

from dcsjax.engine import plan
from dcsjax.engine.load import load_config
from dcsjax.engine.batches import _batch_logprobs

pytestmark = pytest.mark.slow


def small_llama(layers: int = 2):
    """Llama-3.1-8B's published config at a width where the matmuls dominate as they do at full size."""
    config, _ = load_config("llama-3.1-8b")
    return dataclasses.replace(config, vocab_size=16384, hidden_size=1024, num_layers=layers, num_heads=8,
                               num_kv_heads=4, head_dim=128, mlp_size=4096)


@pytest.fixture(scope="module")
def slice_2x2():
    return plan.topology_mesh("v5e:2x2")


def test_scoring_program_compiles_for_v5e_and_its_flops_are_the_models(slice_2x2):
    mesh, chip = slice_2x2
    assert dict(mesh.shape) == {"data": 2, "model": 2} and chip.name == "TPU v5e"
    r = plan.plan_scoring(small_llama(), mesh, chip, rows=4, length=512)
    assert r["argument_bytes"] >= r["params_bytes"] > 0 and r["code_bytes"] > 0
    assert r["fits"] and r["most_rows"] > r["rows"] and r["most_rows"] % 2 == 0
    # the model's FLOPs for 4 x 512 tokens (matmuls, and causal attention over (T + 1) / 2 keys on average)
    # against what XLA counts in the compiled program: within 5% (dense attention scores every key, masked or not)
    assert r["compiled_over_model"] == pytest.approx(1.0, abs=0.05), r
    assert r["estimated_seconds"] > 0 and 0 < r["estimated_mfu"] < 1 and r["estimated_tokens_per_s"] > 0
    assert "not measured" in r["estimate"] and r["attention_kernel"] is None  # short rows: the dense path


def test_decode_program_compiles_for_v5e_with_its_cache(slice_2x2):
    mesh, chip = slice_2x2
    c = small_llama()
    r = plan.plan_decode(c, mesh, chip, rows=8, cached=256, new_tokens=4)
    # the cache of every layer, row and slot, per chip (rows split over data, KV heads over model)
    assert r["kv_cache_bytes_per_chip"] == 2 * c.num_layers * 8 * 260 * c.num_kv_heads * c.head_dim * 2 // 4
    assert r["argument_bytes"] >= r["params_bytes"] > 0 and r["fits"]
    assert r["compiled_over_model"] == pytest.approx(1.0, abs=0.05), r
    assert r["estimated_seconds"] > 0 and r["estimated_tokens_per_s"] > 0
    # never faster than reading the chip's weights and its share of the cache once a step at HBM bandwidth
    floor = (r["params_bytes"] + r["kv_cache_bytes_per_chip"]) / chip.hbm_bytes_per_s
    assert r["hbm_floor_seconds"] == pytest.approx(floor)
    # the scanned step, as it runs, prefetches each layer's q, k and v weight slices and its keys' and values'
    # cache slices into VMEM (on chip) before the dots read them, and copies nothing into HBM (with this libtpu,
    # on v5e): no traffic added. Shards per chip: heads over model (2), rows over data (2), KV heads over model
    d, k = c.hidden_size, c.head_dim
    weights = d * (c.num_heads + 2 * c.num_kv_heads) // 2 * k * 2
    cache = 2 * (8 // 2) * 260 * (c.num_kv_heads // 2) * k * 2
    copies = r["scan_copies"]
    assert copies["scanned_vmem_bytes_per_layer"] == weights + cache
    assert (copies["scanned_hbm_bytes_per_layer"], copies["written_out_hbm_bytes_per_layer"], copies["seconds"]) == (0, 0, 0)
    assert r["estimated_seconds"] == pytest.approx(max(r["xla_seconds"], floor) + copies["seconds"])


def test_a_cache_whose_kv_heads_the_model_axis_does_not_divide_is_split_over_head_size():
    """Two KV heads on a model axis of 4 (as Llama-3.1-70B's 8 on 16): the decoding loop carries its cache split
    over the head size, [L, B, S, 2, K/4] a chip. The control, the same program with the cache's layout left to
    XLA (as before `sharding.CACHE_AXES`), holds it whole on every chip, [L, B, S, 2, K]."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from dcsjax.engine.generate import _decode

    mesh, _ = plan.topology_mesh("v5e:2x2", "1x4")
    c = dataclasses.replace(small_llama(), num_kv_heads=2)
    rows, cached, new = 8, 256, 4
    graphdef, state = plan.abstract_model(c, mesh)
    keys = jax.ShapeDtypeStruct((rows,), jax.random.key(0).dtype, sharding=NamedSharding(mesh, P("data")))

    def program(constrained):
        return _decode.lower(graphdef, state, plan.row_shapes((rows, cached), mesh), plan.row_shapes((rows,), mesh),
                             keys, new, 0.0, 1.0, (0,), mesh if constrained else None).compile().as_text()

    per_chip = f"bf16[{c.num_layers},{rows},{cached + new},2,{c.head_dim // 4}]"
    whole = f"bf16[{c.num_layers},{rows},{cached + new},2,{c.head_dim}]"
    text = program(True)
    assert per_chip in text and whole not in text
    assert whole in program(False)


def test_depth_scaled_cost_equals_the_whole_unrolled_program(slice_2x2):
    """c(1) + 3 (c(2) - c(1)) for four layers, against XLA's count of the four-layer program written out;
    the rolled program's count is the control: XLA counts its loop bodies once, one layer's worth."""
    mesh, _ = slice_2x2
    c = dataclasses.replace(small_llama(layers=4), hidden_size=256, mlp_size=512, head_dim=32)

    def program(config, unrolled=True):
        graphdef, state = plan.abstract_model(config, mesh)
        fn = plan.unrolled_jit(_batch_logprobs, (0, 1, 2)) if unrolled else _batch_logprobs
        return fn.lower(graphdef, 8192, mesh, state, *(plan.row_shapes((2, 256), mesh) for _ in range(5))).compile()

    scaled = plan.scaled_cost(dataclasses.replace(c, num_layers=4), lambda cfg: program(cfg))
    assert plan.layer_period(c) == 1
    whole = plan.cost_of(program(c))
    assert scaled["flops"] == pytest.approx(whole["flops"], rel=0.01)
    # seconds within 10%: the cost model schedules a whole program's layers together (6% apart at this size)
    assert scaled["optimal_seconds"] == pytest.approx(whole["optimal_seconds"], rel=0.1)
    # the control: XLA's count of the engine's own (rolled) program is that of one layer
    one_layer = plan.cost_of(program(plan.truncated(c, 1)))["flops"]
    assert plan.cost_of(program(c, unrolled=False))["flops"] == pytest.approx(one_layer, rel=0.02)
    assert one_layer < 0.75 * whole["flops"]


def test_gemma_layer_period_is_its_pattern_of_local_and_global_layers():
    gemma2, _ = load_config("gemma-2-9b")
    assert plan.layer_period(gemma2) == 2 and plan.layer_period(small_llama()) == 1


def test_unrolled_loops_compute_what_the_loops_compute(tiny):
    """On CPU, the plan's unrolled program (every scan, map and cond written out; long rows take the
    blockwise tiles) gives the engine's log-probs."""
    rng = np.random.default_rng(0)
    t = 1024  # the blockwise path, with its tiles and skipped (dead) tiles
    tokens = rng.integers(0, tiny.config.vocab_size, (2, t)).astype(np.int32)
    positions = np.tile(np.arange(t, dtype=np.int32), (2, 1))
    segments = np.ones((2, t), np.int32)
    segments[1, 700:] = 2  # two documents packed in the second row
    positions[1, 700:] -= 700
    attend_to = np.zeros((2, t), np.int32)
    targets = np.roll(tokens, -1, axis=1)
    args = (tiny.graphdef, 8192, None, tiny.state, tokens, positions, segments, attend_to, targets)
    rolled = np.asarray(_batch_logprobs(*args))
    written_out = np.asarray(plan.unrolled_jit(_batch_logprobs, (0, 1, 2))(*args))
    np.testing.assert_allclose(written_out, rolled, atol=1e-5)


def test_plan_command_prints_its_table_and_json(tmp_path, capsys):
    from dcsjax.cli import main

    out = tmp_path / "plan.json"
    assert main(["plan", "--model", "smollm2-135m-instruct", "--topology", "v5e:2x2", "--programs", "score",
                 "--rows", "2", "--length", "128", "--vocab-chunk", "16384", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "v5e:2x2" in printed and "est. MFU" in printed and "not measured" in printed
    (row,) = json.loads(out.read_text())
    assert row["model"] == "smollm2-135m-instruct" and row["mesh"] == "2x2" and row["program"] == "score"
    assert row["vocab_chunk"] == 16384  # the log-prob kernel's chunk, as given (default the engine's)


def test_a_topology_libtpu_does_not_know_is_one_line():
    from dcsjax.errors import ConfigError

    with pytest.raises(ConfigError, match="topology 'v9z:2x2'"):
        plan.topology_mesh("v9z:2x2")
    with pytest.raises(ConfigError, match="mesh 3x1 needs 3 devices; v5e:2x2 has 4"):
        plan.topology_mesh("v5e:2x2", "3x1")


def test_training_step_compiles_for_v5e(slice_2x2):
    """train-abstain's update (top blocks trained, or LoRA factors) compiles for the slice, its optimizer
    state split as its parameters are."""
    from dcsjax.training.plan import plan_training
    from dcsjax.training.train import TrainConfig

    mesh, chip = slice_2x2
    c = dataclasses.replace(small_llama(layers=4), hidden_size=256, mlp_size=512, head_dim=32)
    r = plan_training(c, mesh, chip, TrainConfig(adapter="lora", batch_size=4), top_layers=2, prompt=64)
    assert r["program"] == "train" and r["rows"] == 4 and r["fits"] and r["argument_bytes"] > 0
    assert r["compiled_flops"] > 0 and r["estimated_seconds"] > 0 and "not measured" in r["estimate"]


def test_a_program_larger_than_the_chip_is_reported_not_raised(slice_2x2):
    """libtpu refuses to compile a program whose temporaries exceed a chip's HBM: the plan reads what it
    says the program needs and reports it as not fitting."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh, _ = slice_2x2
    x = plan.jax.ShapeDtypeStruct((100_000,), plan.jnp.float32, sharding=NamedSharding(mesh, P()))
    outer = plan.jax.jit(lambda v: plan.jnp.sort(v[:, None] * v[None, :], axis=0)[0])  # a 40 GB temporary
    compiled, memory, _ = plan.compile_memory(outer, x)
    assert compiled is None and "RESOURCE_EXHAUSTED" in memory["refused"]
    assert memory["temp_bytes"] > 16 * 2**30 and memory["argument_bytes"] == 400_000


def test_long_rows_compile_for_tpu_through_the_splash_kernel(slice_2x2):
    """Rows of 1,024 tokens on a v5e slice: the scoring step attends through splash (a Mosaic custom call, under
    shard_map), which XLA's cost model counts as free; the plan adds the kernel's tiles, so its FLOPs are again
    the model's (the causal half of 2 x 2 tiles of 512 is 3 tiles, not 2: within 10%)."""
    mesh, chip = slice_2x2
    c = small_llama(layers=1)
    graphdef, state = plan.abstract_model(c, mesh)
    args = (graphdef, 8192, mesh, state, *(plan.row_shapes((2, 1024), mesh) for _ in range(5)))
    assert 'custom_call_target="tpu_custom_call"' in _batch_logprobs.lower(*args).compile().as_text()
    assert plan.splash_tiles(2048) == 10 and plan.splash_tiles(2048, window=512) == 7 and plan.splash_tiles(256) == 1
    r = plan.plan_scoring(c, mesh, chip, rows=2, length=1024)
    kernel = r["attention_kernel"]
    assert kernel["name"] == "splash" and kernel["flops"] == 4 * 512 * 512 * 128 * (8 // 2) * 1 * 3
    assert r["compiled_over_model"] == pytest.approx(1.0, abs=0.1), r


def test_moe_experts_are_routed_on_tpu_each_device_its_own(slice_2x2):
    """Qwen3-30B-A3B's published config, one layer, on v5e:2x2: the TPU branch of the MoE runs grouped matmuls
    (`ragged-dot`) on each model device's own experts; no expert weight is gathered (left to XLA's partitioner
    every layer gathered all 128 experts onto every device), and the compiled FLOPs are near the routed model's
    (dense experts would count E / k = 16 times the routed expert FLOPs). XLA counts every (token, expert) pair
    row of a device's grouped matmuls, its own or not: on 2 model devices that is up to 2x the experts' share."""
    import re

    c, _ = load_config("qwen3-30b-a3b")
    c = dataclasses.replace(c, num_layers=1, layer_is_local=c.layer_is_local[:1], layer_uses_rope=c.layer_uses_rope[:1],
                            vocab_size=16384)
    mesh, chip = slice_2x2
    graphdef, state = plan.abstract_model(c, mesh)
    compiled = _batch_logprobs.lower(graphdef, c.vocab_size, mesh, state,
                                     *(plan.row_shapes((4, 512), mesh) for _ in range(5))).compile()
    text = compiled.as_text()
    assert "ragged-dot" in text
    gathered = [tuple(map(int, s.split(","))) for s in re.findall(r"= \w+\[([\d,]+)\][^=]*? all-gather(?:-start)?\(", text)]
    expert_size = c.hidden_size * c.expert_mlp_size
    assert all(np.prod(s) < expert_size for s in gathered), gathered  # the router's [D, E] is; no expert is
    flops = plan.cost_of(compiled)["flops"]  # one layer, one vocabulary chunk: no loop counted short
    model = c.flops_per_token(mean_context=(512 + 1) / 2) * 4 * 512 / mesh.size
    assert 0.9 < flops / model < 2, flops / model


def test_the_scans_copies_are_found_where_the_cpu_profile_measures_them():
    """`engine.copies` on the CPU backend, where bench/profile_decode.py measures a decode step spending over half
    its time copying the layer scan's slices: compiled for one CPU device, the scanned step copies every weight
    matrix of its layer and its cache slices into buffers of device memory (some relaid out, found by their
    size), so the count a layer equals the layer's matrices and cache slices counted from the config by hand."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding

    from dcsjax.engine import copies
    from dcsjax.nn.sharding import CACHE_AXES, partition_spec

    mesh = jax.make_mesh((1, 1), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2, devices=jax.devices("cpu")[:1])
    c = small_llama()
    graphdef, state = plan.abstract_model(c, mesh, jnp.float32)
    shape = (c.num_layers, 8, 260, c.num_kv_heads, c.head_dim)
    cache = jax.ShapeDtypeStruct(shape, jnp.float32, sharding=NamedSharding(mesh, partition_spec(CACHE_AXES, shape, mesh)))
    rows = plan.row_shapes((8,), mesh)
    step = jax.jit(plan._decode_step, static_argnums=(0, 1), donate_argnums=(5, 6))
    hlo = step.lower(graphdef, mesh, state, rows, rows, cache, cache).compile().as_text()
    names = copies.per_layer_shapes(state, shape)
    found = copies.copied_slices(hlo, names)
    assert {"down", "gate or up", "k or v", "o or q", "KV cache"} <= {x["of"] for x in found}, found
    d, k, mlp = c.hidden_size, c.head_dim, c.mlp_size
    matrices = d * (2 * c.num_heads + 2 * c.num_kv_heads) * k + 3 * d * mlp  # q, k, v, o; gate, up, down
    assert copies.layer_copy_bytes(hlo, names, 1) == {"HBM": (matrices + 2 * 8 * 260 * c.num_kv_heads * k) * 4, "VMEM": 0}
