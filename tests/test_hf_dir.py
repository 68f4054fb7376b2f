"""HF checkpoint directories (config.json + safetensors, streamed), written by transformers from the very
same GGUF weights: dcsjax must read them into the same model, in float32 and in bfloat16."""

import numpy as np
import pytest

import dcsjax
from conftest import PASSAGE, reference_for, reference_tokenizer, scorer_for
from dcsjax.errors import CheckpointError


def save_hf_dir(name, directory, dtype=None):
    """config.json, tokenizer and two safetensors shards from transformers' model of the GGUF file.

    transformers will not `save_pretrained` a GGUF-loaded model, so its state dict is written directly.
    """
    import json

    import torch
    from safetensors.torch import save_file

    model = reference_for(name)
    directory.mkdir(parents=True)
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    (directory / "config.json").write_text(json.dumps(config))
    tensors = {k: v.detach().to(dtype or torch.float32).contiguous().clone() for k, v in model.state_dict().items()}
    names = sorted(tensors)
    for shard, part in enumerate([names[: len(names) // 2], names[len(names) // 2:]]):
        save_file({k: tensors[k] for k in part}, str(directory / f"model-{shard:05d}.safetensors"))
    reference_tokenizer(name).save_pretrained(directory)  # transformers' tokenizer of the GGUF file
    return directory


@pytest.fixture(scope="module")
def texts():
    words = PASSAGE.split()
    return [" ".join(words[i:i + n]) for i, n in [(0, 5), (40, 60), (100, 17), (300, 120)]]


@pytest.mark.slow
def test_hf_directory_scores_like_the_gguf(model_name, tmp_path, texts):
    gguf_scorer = scorer_for(model_name)
    directory = save_hf_dir(model_name, tmp_path / "hf")
    assert len(list(directory.glob("*.safetensors"))) == 2
    hf_scorer = dcsjax.load(directory, document_start=gguf_scorer.card.document_start)
    assert hf_scorer.config == gguf_scorer.config
    assert hf_scorer.document_start_id == gguf_scorer.document_start_id
    np.testing.assert_array_equal(hf_scorer.score(texts), gguf_scorer.score(texts))


@pytest.mark.slow
def test_bfloat16_checkpoint_and_weights(tmp_path, texts):
    """bfloat16 tensors in the safetensors file, bfloat16 parameters, float32 log-probs."""
    import torch

    name = "smollm2-135m-instruct"
    directory = save_hf_dir(name, tmp_path / "bf16", dtype=torch.bfloat16)
    bf16 = dcsjax.load(directory, dtype="bfloat16", document_start="<|endoftext|>")
    assert bf16.model.embed[...].dtype == np.dtype("bfloat16")
    lps = bf16.token_logprobs(texts)
    assert all(lp.dtype == np.float32 for lp in lps)
    f32 = scorer_for(name).token_logprobs(texts)
    per_token = np.concatenate([a - b for a, b in zip(lps, f32)])
    print(f"bfloat16 weights vs float32: mean |per-token difference| {np.abs(per_token).mean():.3f} nats")
    assert np.abs(per_token).mean() < 0.2
    # bfloat16 scores too do not move with batch size or packing: short texts packed at odd and even
    # offsets, then each alone in its row
    words = PASSAGE.split()
    rng = np.random.default_rng(0)
    short = [" ".join(words[i:i + n]) for i, n in zip(rng.integers(0, 400, 48), rng.integers(6, 30, 48))]
    packed = bf16.token_logprobs(short)
    alone = bf16.replace(batch_size=1, pack=False).token_logprobs(short[:16])
    assert all((a == b).all() for a, b in zip(alone, packed))


def test_broken_directories(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no config.json"):
        dcsjax.load(tmp_path / "empty")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="broken JSON"):
        dcsjax.load(bad)


def test_a_missing_shard_is_named_before_any_tensor_is_read(tmp_path):
    """An index naming two shards, one of them not downloaded: the error names the missing file."""
    import json

    from safetensors.numpy import save_file

    from dcsjax.checkpoints.hf_dir import hf_tensors

    directory = tmp_path / "sharded"
    directory.mkdir()
    save_file({"a": np.zeros(2, np.float32)}, str(directory / "model-00001-of-00002.safetensors"))
    (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": {
        "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    with pytest.raises(CheckpointError, match="names 2 shards; missing: model-00002-of-00002.safetensors"):
        next(hf_tensors(directory))
