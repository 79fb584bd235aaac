"""Steering vectors as files (engine/steering_files.py): a llama.cpp control vector read back by
gguf's own reader with the same numbers, and safetensors with the prompts in the metadata."""
from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from engine.steering import Steering
from engine.steering_files import load_control_vector, load_steering, save_control_vector, save_steering

N_LAYER, N_EMBD = 6, 16


def a_steering(layer: int, strength: float = 2.5) -> Steering:
    torch.manual_seed(layer)
    return Steering(layer=layer, vector=torch.randn(N_EMBD), strength=strength)


@pytest.mark.parametrize("layer", [2, 4, N_LAYER])
def test_gguf_reader_reads_back_the_numbers_and_the_metadata(tmp_path, layer):
    steering = a_steering(layer)
    path = tmp_path / "happy.gguf"
    save_control_vector(path, steering, model_hint="gpt2", n_layer=N_LAYER)

    reader = gguf.GGUFReader(str(path))
    assert reader.get_field("general.architecture").contents() == "controlvector"
    assert reader.get_field("controlvector.model_hint").contents() == "gpt2"
    assert reader.get_field("controlvector.layer_count").contents() == N_LAYER - 1
    tensors = {t.name: t for t in reader.tensors}
    # llama.cpp adds direction.k after block k counted from 0: after block L (1-based) is k = L - 1.
    assert set(tensors) == {f"direction.{k}" for k in range(1, N_LAYER)}
    for name, tensor in tensors.items():
        assert tensor.tensor_type == gguf.GGMLQuantizationType.F32 and list(tensor.shape) == [N_EMBD]
        expected = (steering.strength * steering.vector).numpy() if name == f"direction.{layer - 1}" else 0
        np.testing.assert_array_equal(tensor.data, np.broadcast_to(expected, (N_EMBD,)).astype(np.float32))


def test_load_control_vector_gives_back_the_steered_layer_and_what_it_adds(tmp_path):
    steering = a_steering(3, strength=-1.5)
    save_control_vector(tmp_path / "v.gguf", steering, model_hint="bundled", n_layer=N_LAYER)
    loaded = load_control_vector(tmp_path / "v.gguf")
    assert loaded.model_hint == "bundled" and loaded.layer_count == N_LAYER - 1
    assert sorted(loaded.directions) == list(range(2, N_LAYER + 1))
    back = loaded.steering()
    assert back.layer == 3 and back.strength == 1.0
    assert torch.equal(back.addition, steering.addition)


@pytest.mark.parametrize("layer", [0, 1])
def test_layers_llama_cpp_cannot_steer_are_refused(tmp_path, layer):
    with pytest.raises(ValueError, match="no llama.cpp control-vector equivalent"):
        save_control_vector(tmp_path / "v.gguf", a_steering(layer), model_hint="gpt2", n_layer=N_LAYER)
    assert not (tmp_path / "v.gguf").exists()


def test_a_layer_past_the_model_is_refused(tmp_path):
    with pytest.raises(ValueError, match="between 0 and"):
        save_control_vector(tmp_path / "v.gguf", a_steering(N_LAYER + 1), model_hint="gpt2", n_layer=N_LAYER)


def test_a_gguf_that_is_not_a_control_vector_is_refused(tmp_path):
    writer = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "gpt2")
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="not a llama.cpp control vector"):
        load_control_vector(tmp_path / "m.gguf")


@pytest.mark.parametrize("layer", [0, 1, N_LAYER])
def test_safetensors_round_trip_keeps_the_vector_and_where_it_came_from(tmp_path, layer):
    steering = a_steering(layer)
    positive, negative = ["I love this.", "A happy day, «très» bien."], ["I hate this.", "A sad day."]
    save_steering(tmp_path / "s.safetensors", steering, positive, negative, model="assets/bundled", n_layer=N_LAYER)
    back = load_steering(tmp_path / "s.safetensors")
    assert (back.positive, back.negative, back.model, back.n_layer) == (positive, negative, "assets/bundled", N_LAYER)
    assert back.steering.layer == layer and back.steering.strength == steering.strength
    assert torch.equal(back.steering.vector, steering.vector)


def test_safetensors_of_something_else_is_refused(tmp_path):
    from safetensors.torch import save_file
    save_file({"vector": torch.zeros(3)}, str(tmp_path / "x.safetensors"))
    with pytest.raises(ValueError, match="not a steering vector"):
        load_steering(tmp_path / "x.safetensors")
