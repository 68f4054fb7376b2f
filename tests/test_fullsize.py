"""Published full-size configs (`models/configs/`: their hub config.json, as the hub serves them:
transformers 4's spelling; `dcsjax plan` reads them) give their published parameter counts through `jax.eval_shape` (no memory), and on an abstract 8-device
mesh each device holds an eighth of the parameters: vocabulary, MLP and attention split, nothing large
replicated (Qwen2.5-7B's 28 heads and Phi-4's 10 KV heads split over their head size)."""

import math

import pytest
from flax import nnx

from dcsjax.engine.load import load_config
from dcsjax.nn.decoder import Decoder
from dcsjax.nn.sharding import partition_spec

# name in models/configs/ (config.json as published): parameters as published
PUBLISHED = {"llama-3.1-8b": 8_030_261_248, "llama-3.1-70b": 70_553_706_496, "qwen2.5-7b": 7_615_616_512,
             "gemma-2-9b": 9_241_705_984, "olmo-2-1124-7b": 7_298_617_344, "qwen3-30b-a3b": 30_532_122_624,
             "falcon-7b": 6_921_720_704, "phi-4": 14_659_507_200}


class AbstractMesh:  # partition_spec reads only the axis sizes
    shape = {"data": 1, "model": 8}


def test_every_published_config_has_its_published_size():
    from dcsjax.checkpoints.cards import published_config_names

    assert published_config_names() == sorted(PUBLISHED)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_configs_give_published_sizes_and_shard_eight_ways(name):
    published = PUBLISHED[name]
    config, _ = load_config(name)
    model = nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(0)))
    params = nnx.state(model, nnx.Param)
    leaves = [leaf for leaf in nnx.to_flat_state(params)]
    total = sum(math.prod(v.shape) for _, v in leaves)
    assert abs(total - published) / published < 0.01, (name, total, published)
    per_device, replicated = 0, []
    for path, v in leaves:
        spec = partition_spec(v.axes, v.shape, AbstractMesh())
        split = math.prod(8 if s == "model" else 1 for s in spec)
        per_device += math.prod(v.shape) // split
        if split == 1 and math.prod(v.shape) > 1e6:
            replicated.append("/".join(map(str, path)))
    fraction = per_device / total
    print(f"{name}: {total:,} parameters (published {published:,}); per device on 8: {fraction:.3f} of them, "
          f"{per_device * 2 / 2**30:.2f} GiB in bfloat16; replicated: {replicated or 'nothing large'}")
    assert replicated == [] and fraction == pytest.approx(1 / 8, rel=0.001)
