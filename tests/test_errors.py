"""Bad input is a clear error naming the text or file at fault."""

import shutil

import pytest

import dcsjax
from dcsjax.errors import CheckpointError, InputError, UnknownModelError
from dcsjax.checkpoints.fetch import fetch_model


def test_empty_text_is_named(smollm2):
    with pytest.raises(InputError, match="text 1 is empty"):
        smollm2.score(["fine", "", "also fine"])
    with pytest.raises(InputError, match="continuation 0 is empty"):
        smollm2.score_continuations(["context"], [""])
    with pytest.raises(InputError, match="text 0 is a int"):
        smollm2.score([3])


def test_text_longer_than_the_context_is_refused_not_truncated(smollm2):
    limit = smollm2.max_length
    assert limit == 8192  # SmolLM2's context
    too_long = "word " * limit
    with pytest.raises(InputError, match=r"text 1 has \d+ tokens.*8192-token limit"):
        smollm2.token_logprobs(["short", too_long])


def test_unknown_model_name_lists_the_known_ones():
    with pytest.raises(UnknownModelError, match="unknown model 'llama-9000'.*smollm2-135m-instruct"):
        dcsjax.load("llama-9000")


def test_missing_model_file(tmp_path):
    with pytest.raises(CheckpointError, match="no such"):
        dcsjax.load(tmp_path / "absent.gguf")


@pytest.mark.parametrize("keep", [1000, 49_000_000])
def test_truncated_gguf_file_is_named(tmp_path, keep):
    whole = fetch_model("smollm2-135m-instruct")
    cut = tmp_path / "cut.gguf"
    with whole.open("rb") as src, cut.open("wb") as dst:
        dst.write(src.read(keep))
    with pytest.raises(CheckpointError, match=f"{cut}: not a readable GGUF file"):
        dcsjax.load(cut, document_start="<|endoftext|>")


def test_gguf_without_bos_needs_a_document_start(tmp_path):
    """The same SmolLM2 file, loaded by path rather than by card: nothing says how a document starts."""
    from dcsjax.errors import ConfigError

    copy = tmp_path / "smol.gguf"
    shutil.copy(fetch_model("smollm2-135m-instruct"), copy)
    with pytest.raises(ConfigError, match="document_start"):
        dcsjax.load(copy)


def test_sigterm_inside_a_gc_callback_is_kept_for_the_next_stop_point():
    """A SIGTERM handled while a garbage-collection callback runs (JAX installs one) would be printed as an
    "ignored" exception and lost, and the run would go to its end; it is kept and raised at the next write."""
    import gc
    import sys

    from dcsjax.errors import Terminated, clear_stop_request, request_stop, stop_point

    clear_stop_request()

    def callback(phase, info):
        request_stop(15, sys._getframe())

    lost = []
    hook, sys.unraisablehook = sys.unraisablehook, lost.append  # where "Exception ignored in" is printed from
    gc.callbacks.append(callback)
    try:
        gc.collect()
    finally:
        gc.callbacks.remove(callback)
        sys.unraisablehook = hook
    assert lost == []
    with pytest.raises(Terminated):
        stop_point()
    clear_stop_request()
    stop_point()  # forgotten: a second run in the same process starts afresh
    with pytest.raises(Terminated):  # anywhere else, it stops at once, as Ctrl-C does
        request_stop(15, sys._getframe())
    clear_stop_request()
