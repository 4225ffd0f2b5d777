"""How bench/cross_encoder.py quantizes its fp32 export (bench/cross_encoder_quant.py measures each way): a name
says what is kept fp32, the same fp32 file always gives the same bytes (the shipped file's `trained_by` rebuilds
it), and a question too long for the room is cut as the service cuts it. These run without torch."""

import hashlib
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import cross_encoder

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime.quantization")


def tiny_export(path: Path) -> Path:
    """A graph named as torch exports the cross-encoder: one layer's FFN, its attention output, the head."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    pick = np.random.default_rng(33)
    weights = {
        "w_attn": pick.normal(size=(8, 8)),
        "w_in": pick.normal(size=(8, 16)),
        "w_out": pick.normal(size=(16, 8)),
        "w_head": pick.normal(size=(1, 8)),
        "b_head": np.zeros(1),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "w_attn"], ["a"], name="/layers.0/attention_out/MatMul"),
        helper.make_node("MatMul", ["a", "w_in"], ["h"], name="/layers.0/intermediate/MatMul"),
        helper.make_node("MatMul", ["h", "w_out"], ["o"], name="/layers.0/out/MatMul"),
        helper.make_node("Gemm", ["o", "w_head", "b_head"], ["logit"], name="/head/Gemm", transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", 8])],
        [helper.make_tensor_value_info("logit", TensorProto.FLOAT, ["rows", 1])],
        [numpy_helper.from_array(w.astype(np.float32), name) for name, w in weights.items()],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def fp32_nodes(path: Path) -> set[str]:
    return {n.name for n in onnx.load(str(path)).graph.node if n.op_type in ("MatMul", "Gemm")}


def test_each_name_keeps_its_matmuls_fp32(tmp_path):
    fp32 = tiny_export(tmp_path / "fp32.onnx")
    kept = {}
    for how in ("int8", "int8-tensor", "int8-keep-ffn-out", "int8-keep-ffn", "int8-tensor-keep-head"):
        cross_encoder.quantize(fp32, tmp_path / f"{how}.onnx", how)
        kept[how] = fp32_nodes(tmp_path / f"{how}.onnx")
    assert kept["int8"] == kept["int8-tensor"] == set()
    assert kept["int8-keep-ffn-out"] == {"/layers.0/out/MatMul"}
    assert kept["int8-keep-ffn"] == {"/layers.0/out/MatMul", "/layers.0/intermediate/MatMul"}
    assert kept["int8-tensor-keep-head"] == {"/head/Gemm_MatMul"}  # the Gemm is quantized as a MatMul
    assert cross_encoder.dynamic_options("int8-tensor-reduce-keep-last") == (False, True, "last")
    with pytest.raises(SystemExit, match="unknown quantization"):
        cross_encoder.dynamic_options("int8-keep-everything")


def test_the_same_fp32_file_gives_the_same_bytes(tmp_path):
    fp32 = tiny_export(tmp_path / "fp32.onnx")
    for how in ("int8", "int8-tensor"):
        first = cross_encoder.quantize(fp32, tmp_path / "a.onnx", how)
        assert first == cross_encoder.quantize(fp32, tmp_path / "b.onnx", how)
        assert first == hashlib.sha256((tmp_path / "b.onnx").read_bytes()).hexdigest()
    assert (
        cross_encoder.quantize(fp32, tmp_path / "fp32-copy.onnx", "fp32")
        == hashlib.sha256(fp32.read_bytes()).hexdigest()
    )


def test_a_long_question_is_cut_as_the_service_cuts_it():
    pytest.importorskip("tokenizers")
    tokenizer = cross_encoder.load_tokenizer(28)
    short = "What port does payments-api listen on?"
    long = "Which of the services that the platform team moved to the new cluster in the spring " * 3
    assert cross_encoder.served(tokenizer, short) == short
    cut = cross_encoder.served(tokenizer, long)
    assert long.startswith(cut) and len(cross_encoder.question_words().encode(cut, add_special_tokens=False)) == 14
    tokenizer.encode(cut, "atlas (payments-api): serves on port 8443")  # fits: the whole question did not
    with pytest.raises(Exception, match="Truncation"):
        tokenizer.encode(long, "atlas (payments-api): serves on port 8443")
