"""dcsjax's GGUF header reader (`gguf_file.read_gguf`) gives what `gguf.GGUFReader` gives, value for value
and tensor for tensor: on both real files, and on small files that `gguf.GGUFWriter` writes with every
value type, both byte orders, a custom alignment and plain and quantised tensors."""

import numpy as np
import pytest

import gguf
from gguf.quants import quantize

from dcsjax.checkpoints.gguf_file import open_gguf, read_gguf
from dcsjax.errors import CheckpointError
from dcsjax.checkpoints.fetch import fetch_model


def assert_same_as_gguf_reader(path):
    ours, theirs = read_gguf(path), gguf.GGUFReader(str(path))
    keys = [key for key in theirs.fields if not key.startswith("GGUF.")]  # the reader's own header entries
    assert list(ours.metadata) == keys
    for key in keys:
        want = theirs.fields[key].contents()
        got = ours.metadata[key]
        assert got == want, key
        # the same Python types too (int against float against bool), element by element for arrays
        assert [type(x) for x in np.ravel(np.array(got, dtype=object))] == \
            [type(x) for x in np.ravel(np.array(want, dtype=object))], key
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for got, want in zip(ours.tensors, theirs.tensors):
        assert got.tensor_type == want.tensor_type and got.shape == tuple(int(s) for s in want.shape), got.name
        assert got.data.dtype == want.data.dtype and got.data.shape == want.data.shape, got.name
        assert np.array_equal(got.data, want.data), got.name
    return ours


@pytest.mark.slow
@pytest.mark.parametrize("name", ["smollm2-135m-instruct", "gemma3-270m"])
def test_real_files_read_as_the_gguf_package_reads_them(name):
    ours = assert_same_as_gguf_reader(fetch_model(name))
    assert len(ours.metadata["tokenizer.ggml.tokens"]) in (49152, 262144)


def write_every_kind(path, endian):
    writer = gguf.GGUFWriter(path, "llama", endianess=endian)
    writer.add_custom_alignment(64)
    writer.add_uint8("t.u8", 200)
    writer.add_int8("t.i8", -100)
    writer.add_uint16("t.u16", 60000)
    writer.add_int16("t.i16", -30000)
    writer.add_uint32("t.u32", 4_000_000_000)
    writer.add_int32("t.i32", -2_000_000_000)
    writer.add_uint64("t.u64", 2**63 + 5)
    writer.add_int64("t.i64", -(2**62))
    writer.add_float32("t.f32", 0.1)
    writer.add_float64("t.f64", 0.1)
    writer.add_bool("t.bool", True)
    writer.add_string("t.str", "émoji 🙂 数字")
    writer.add_string("t.empty", "")
    writer.add_array("t.ints", [1, -2, 3])
    writer.add_array("t.floats", [0.5, -1.25, 3.0e-8])
    writer.add_array("t.bools", [True, False, True])
    writer.add_array("t.strings", ["a", "", "ünï", "<|im_end|>"])
    writer.add_array("t.nothing", [])
    rng = np.random.default_rng(0)
    writer.add_tensor("plain32", rng.normal(size=(3, 5)).astype(np.float32))
    writer.add_tensor("plain16", rng.normal(size=(7,)).astype(np.float16))
    writer.add_tensor("ints", np.arange(6, dtype=np.int32).reshape(2, 3))
    q8 = rng.normal(size=(2, 64)).astype(np.float32)
    writer.add_tensor("q8", quantize(q8, gguf.GGMLQuantizationType.Q8_0), raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("endian", [gguf.GGUFEndian.LITTLE, gguf.GGUFEndian.BIG])
def test_every_value_type_byte_order_and_tensor_kind(tmp_path, endian):
    path = tmp_path / "every.gguf"
    write_every_kind(path, endian)
    ours = assert_same_as_gguf_reader(path)
    assert ours.metadata["t.u64"] == 2**63 + 5 and ours.metadata["t.strings"][2] == "ünï"
    assert ours.metadata["general.alignment"] == 64
    assert [t.tensor_type.name for t in ours.tensors] == ["F32", "F16", "I32", "Q8_0"]


def test_a_damaged_header_is_named(tmp_path):
    path = tmp_path / "every.gguf"
    write_every_kind(path, gguf.GGUFEndian.LITTLE)
    whole = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[:200])  # inside the metadata
    with pytest.raises(CheckpointError, match=r"cut.gguf: not a readable GGUF file .*runs past the end"):
        open_gguf(cut)
    cut.write_bytes(whole[:-100])  # into the last tensor (136 bytes; at most 63 bytes of padding after it)
    with pytest.raises(CheckpointError, match=r"tensor q8's data .* runs past the end"):
        open_gguf(cut)
    cut.write_bytes(b"GGUF" + (9).to_bytes(4, "little") + whole[8:])
    with pytest.raises(CheckpointError, match="GGUF version 9 is not supported"):
        open_gguf(cut)
    cut.write_bytes(b"GGML" + whole[4:])
    with pytest.raises(CheckpointError, match="magic"):
        open_gguf(cut)
