"""bench/cross_encoder_soup.py: the weight average of cross-encoders trained from one start. Each float weight is
the inputs' mean, the graph is the first file's, a file of another shape is refused, and the same inputs give
the same quantized bytes. These run without torch."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime.quantization")
import cross_encoder_soup  # noqa: E402
import numpy as np  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def model(path: Path, scale: float, width: int = 8) -> Path:
    """x @ w then a head (Gemm): w and the head's weight times `scale`, an int64 shape the same in every file."""
    base = np.arange(width * 4, dtype=np.float32).reshape(width, 4) / 10
    inits = [
        numpy_helper.from_array(base * scale, "w"),
        numpy_helper.from_array(np.full((1, 4), scale, dtype=np.float32), "head.weight"),
        numpy_helper.from_array(np.zeros(1, dtype=np.float32), "head.bias"),
        numpy_helper.from_array(np.array([-1, 4], dtype=np.int64), "shape"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="/layers.0/out/MatMul"),
        helper.make_node("Reshape", ["h", "shape"], ["r"], name="/reshape"),
        helper.make_node("Gemm", ["r", "head.weight", "head.bias"], ["logit"], name="/head/Gemm", transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "soup",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", width])],
        [helper.make_tensor_value_info("logit", TensorProto.FLOAT, ["rows", 1])],
        inits,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def weights(m) -> dict[str, np.ndarray]:
    return {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}


def test_each_float_weight_is_the_mean_and_the_graph_is_kept(tmp_path):
    paths = [model(tmp_path / f"{s}.onnx", s) for s in (1.0, 2.0, 6.0)]
    soup = cross_encoder_soup.averaged(paths)
    got, first = weights(soup), weights(onnx.load(str(paths[0])))
    np.testing.assert_allclose(got["w"], first["w"] * 3.0)
    np.testing.assert_allclose(got["head.weight"], np.full((1, 4), 3.0))
    assert got["w"].dtype == np.float32
    np.testing.assert_array_equal(got["shape"], [-1, 4])  # not a float: as it was
    assert [n.name for n in soup.graph.node] == ["/layers.0/out/MatMul", "/reshape", "/head/Gemm"]


def test_a_file_of_another_shape_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="graph is not|names or shapes"):
        cross_encoder_soup.averaged([model(tmp_path / "a.onnx", 1.0), model(tmp_path / "b.onnx", 1.0, width=6)])


def test_the_same_inputs_give_the_same_bytes_and_one_file_gives_itself(tmp_path):
    a, b = model(tmp_path / "a.onnx", 1.0), model(tmp_path / "b.onnx", 3.0)
    for name in ("x", "y"):
        cross_encoder_soup.main([str(a), str(b), "--export", str(tmp_path / f"{name}.onnx")])
    assert (tmp_path / "x.onnx").read_bytes() == (tmp_path / "y.onnx").read_bytes()
    # A file averaged with itself is itself: its quantization is the one the training's --export writes.
    cross_encoder_soup.main([str(a), str(a), "--export", str(tmp_path / "self.onnx"), "--quantize", "fp32"])
    assert np.array_equal(weights(onnx.load(str(tmp_path / "self.onnx")))["w"], weights(onnx.load(str(a)))["w"])
    with pytest.raises(SystemExit, match="two fp32 files"):
        cross_encoder_soup.main([str(a), "--export", str(tmp_path / "one.onnx")])
