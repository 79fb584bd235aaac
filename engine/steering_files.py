"""Steering vectors as files other programs read: a llama.cpp control vector (GGUF) and safetensors.

llama.cpp's control vector (`llama-cli --control-vector FILE`, written by its cvector-generator and
by repeng) is a GGUF file with `general.architecture` = "controlvector", `controlvector.model_hint`
(the model it was made on, a hint only: llama.cpp does not read it), `controlvector.layer_count`
(how many direction tensors there are) and 1-D float32 tensors `direction.k` of n_embd numbers.

Which layer is which, read from llama.cpp's source (common/common.cpp
`common_control_vector_load_one`, src/llama-adapter.cpp, and every model graph's
`cur = build_cvec(cur, il)` right after a block's last residual add): `direction.k` is added to the
output of block k counted from 0, at every position. So this app's "after block L" (L blocks done,
L = 1 .. n_layer) is `direction.{L - 1}`. llama.cpp refuses `direction.0` ("invalid (zero) direction
tensor layer index"), so neither the stream after the embeddings (L = 0) nor after the first block
(L = 1) can be written as a control vector; those are refused here with a clear error.

llama.cpp adds a file's directions times the strength it is given (1 for `--control-vector`), so
the file holds what this app adds, strength * v: the same file with `--control-vector` steers as
the app did. Every steerable layer 1 .. n_layer - 1 gets a tensor, zeros but the steered one, as
llama.cpp's own generator writes them.

The safetensors file keeps the vector itself (`vector`) and, as its metadata (strings), the texts
it came from, its layer, its strength and the model: all a later session needs to steer again.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from .steering import Steering

ARCH = "controlvector"
FORMAT = "pre-ln-gpt2-studio steering"
FIRST_CONTROL_LAYER = 2  # after block 2, direction.1: llama.cpp reads no direction.0


def direction_name(layer: int, n_layer: int) -> str:
    """The llama.cpp tensor of this app's layer L (after block L): direction.{L - 1}."""
    if not 0 <= layer <= n_layer:
        raise ValueError(f"steering layer {layer} is not between 0 and {n_layer}")
    if layer < FIRST_CONTROL_LAYER:
        where = "after the embeddings" if layer == 0 else "after the first block"
        raise ValueError(f"a steering vector at layer {layer} ({where}) has no llama.cpp control-vector "
                         f"equivalent: llama.cpp steers after block 2 (direction.1) to block {n_layer} "
                         f"(direction.{n_layer - 1}) only")
    return f"direction.{layer - 1}"


def save_control_vector(path: str | Path, steering: Steering, model_hint: str, n_layer: int) -> None:
    """Write `steering` as a llama.cpp control vector: strength * vector at direction.{layer - 1}."""
    steered = direction_name(steering.layer, n_layer)
    addition = (steering.strength * steering.vector).detach().to("cpu", torch.float32).numpy()
    names = [f"direction.{k}" for k in range(1, n_layer)]
    writer = gguf.GGUFWriter(str(path), ARCH)
    writer.add_string(f"{ARCH}.model_hint", model_hint)
    writer.add_int32(f"{ARCH}.layer_count", len(names))  # int32, as llama.cpp's cvector-generator writes it
    for name in names:
        writer.add_tensor(name, addition if name == steered else np.zeros_like(addition))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@dataclass(frozen=True)
class ControlVector:
    model_hint: str
    directions: dict[int, torch.Tensor]  # this app's layer L (after block L) -> what is added there
    layer_count: int | None  # controlvector.layer_count: n_layer - 1 where written by llama.cpp or this app

    def steering(self) -> Steering:
        """The one layer that is not zero, as a Steering of strength 1 (the file holds strength * v)."""
        steered = {layer: v for layer, v in self.directions.items() if torch.count_nonzero(v)}
        if len(steered) != 1:
            raise ValueError(f"this control vector steers {len(steered)} layers ({sorted(steered)}); "
                             "a Steering is one layer")
        (layer, vector), = steered.items()
        return Steering(layer=layer, vector=vector, strength=1.0)


def field_value(reader: gguf.GGUFReader, key: str):
    field = reader.get_field(key)
    return None if field is None else field.contents()


def load_control_vector(path: str | Path) -> ControlVector:
    """A llama.cpp control vector: every direction.k at this app's layer k + 1."""
    reader = gguf.GGUFReader(str(path))
    if field_value(reader, "general.architecture") != ARCH:
        raise ValueError(f"{path} is not a llama.cpp control vector (general.architecture is "
                         f"{field_value(reader, 'general.architecture')!r})")
    directions = {}
    for tensor in reader.tensors:
        prefix, _, index = tensor.name.partition(".")
        if prefix != "direction" or not index.isdigit() or int(index) == 0:
            raise ValueError(f"{path}: {tensor.name!r} is not a direction tensor llama.cpp reads")
        if tensor.tensor_type != gguf.GGMLQuantizationType.F32 or len(tensor.shape) != 1:
            raise ValueError(f"{path}: {tensor.name} is not a 1-D float32 tensor")
        directions[int(index) + 1] = torch.from_numpy(np.array(tensor.data, dtype=np.float32))
    count = field_value(reader, f"{ARCH}.layer_count")
    return ControlVector(model_hint=field_value(reader, f"{ARCH}.model_hint") or "", directions=directions,
                         layer_count=None if count is None else int(count))


@dataclass(frozen=True)
class SteeringFile:
    steering: Steering
    positive: list[str]
    negative: list[str]
    model: str
    n_layer: int | None  # the blocks of the model it was made on (None: a file saved without it)


def save_steering(path: str | Path, steering: Steering, positive: str | list[str], negative: str | list[str],
                  model: str, n_layer: int | None = None) -> None:
    """The vector (float32) and, in the metadata, where it came from (the texts, the model and its
    number of blocks) and how strongly it steers."""
    positive = [positive] if isinstance(positive, str) else list(positive)
    negative = [negative] if isinstance(negative, str) else list(negative)
    metadata = {"format": FORMAT, "positive": json.dumps(positive), "negative": json.dumps(negative),
                "layer": str(steering.layer), "strength": repr(float(steering.strength)), "model": model,
                **({} if n_layer is None else {"n_layer": str(n_layer)})}
    save_file({"vector": steering.vector.detach().to("cpu", torch.float32).contiguous()}, str(path),
              metadata=metadata)


def load_steering(path: str | Path) -> SteeringFile:
    """A file of save_steering's, its vector on the CPU in float32."""
    with safe_open(str(path), framework="pt") as f:
        metadata = f.metadata() or {}
        if metadata.get("format") != FORMAT:
            raise ValueError(f"{path} is not a steering vector saved by this app")
        vector = f.get_tensor("vector")
    n_layer = metadata.get("n_layer")
    return SteeringFile(steering=Steering(layer=int(metadata["layer"]), vector=vector,
                                          strength=float(metadata["strength"])),
                        positive=json.loads(metadata["positive"]), negative=json.loads(metadata["negative"]),
                        model=metadata["model"], n_layer=None if n_layer is None else int(n_layer))
