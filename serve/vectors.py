"""Steering vectors as files, on the page's side of a host: the vector a request's steering makes
(Host.steering_vector, a SteeringVector) written as a llama.cpp control vector (GGUF) and as
safetensors with its texts, layer and model in the metadata (engine/steering_files.py has both
formats); and a file a person brings read back (read_vector), checked against the model served, as
the record a run steers by: the request's `steer_file`, {"name", "sha256", "vector"}, which
serve/running.py checks again and names in the run's status line.

Neither needs the model itself, only its shape, so a page in front of replicas (serve/backend.py)
writes and reads the files as a page beside its model does.
"""
from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.steering import Steering
from engine.steering_files import (FIRST_CONTROL_LAYER, load_control_vector, load_steering, save_control_vector,
                                   save_steering)
from model import GPT2Config

from .limits import LIMITS
from .messages import Message, Refusal
from .running import DIGEST_SHOWN

GGUF_MAGIC = b"GGUF"
# A vector file is an n_embd vector, or one a layer for llama.cpp: some hundreds of KB for GPT-2 XL.
# Far past that it is another kind of file (a whole model's GGUF), not read into memory to say so.
MAX_FILE_BYTES = 16 * 2**20
FILE_TYPES = [".gguf", ".safetensors"]  # what the page's import button offers to pick


@dataclass(frozen=True)
class SteeringVector:
    """A request's steering vector, as exported: `vector` (n_embd numbers) is added `strength`
    times after block `layer` of `model`, a model of `n_layer` blocks; made from the pairs of
    `positive` and `negative` lines (none: it came from a file)."""
    vector: list[float]
    layer: int
    strength: float
    positive: list[str]
    negative: list[str]
    model: str
    n_layer: int

    def as_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "SteeringVector":
        return cls(**data)

    @property
    def steering(self) -> Steering:
        return Steering(self.layer, torch.tensor(self.vector, dtype=torch.float32), self.strength)

    @property
    def digest(self) -> str:
        """A name for this vector and all that came with it: the same one exported twice is one file."""
        return hashlib.sha256(repr(dataclasses.astuple(self)).encode(errors="replace")).hexdigest()


def write_vector_files(vector: SteeringVector, folder: Path) -> tuple[list[Path], Message | None]:
    """`vector` written into `folder` as safetensors and, where llama.cpp can steer at its layer,
    as a llama.cpp control vector; the paths, and why there is no GGUF file (None: there is)."""
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"steering-layer{vector.layer}-strength{vector.strength:g}"
    safetensors = folder / f"{stem}.safetensors"
    save_steering(safetensors, vector.steering, vector.positive, vector.negative, vector.model, vector.n_layer)
    if vector.layer < FIRST_CONTROL_LAYER:
        return [safetensors], Message.keyed("steer_no_gguf", layer=vector.layer, first=FIRST_CONTROL_LAYER,
                                            n_layer=vector.n_layer)
    gguf = folder / f"{stem}.gguf"
    save_control_vector(gguf, vector.steering, vector.model, vector.n_layer)
    return [gguf, safetensors], None


@dataclass(frozen=True)
class VectorFile:
    """A steering vector read from a file: what the Steer section shows (its layer, texts and model)
    and what a run steers by (`record`, the request's steer_file)."""
    name: str
    sha256: str
    vector: list[float]
    layer: int
    strength: float  # a control vector holds strength * v, as llama.cpp adds it: its strength is 1
    positive: list[str]
    negative: list[str]
    model: str  # the model it says it was made on ("": it does not say)
    n_layer: int | None  # the blocks of the model it was made for (None: it does not say)

    @property
    def record(self) -> dict:
        return {"name": self.name, "sha256": self.sha256, "vector": self.vector}

    @property
    def imported(self) -> Message:
        """The Steer section's line on it: its name, hash, layer and model."""
        return Message.keyed("steer_imported", file=self.name, digest=self.sha256[:DIGEST_SHOWN], layer=self.layer,
                             model=self.model or "unknown")


def read_vector(path: str | Path | None, config: GPT2Config) -> VectorFile:
    """The steering vector in the file at `path` (a llama.cpp control vector that steers one layer,
    or this app's safetensors), checked against a model of `config`'s shape; a Refusal that says
    what is wrong with it otherwise."""
    try:
        path = Path(path)
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise Refusal("steer_file_size", file=path.name, size=size, limit=MAX_FILE_BYTES)
        data = path.read_bytes()
    except (OSError, TypeError):  # gone from the upload folder, or no file given
        raise Refusal("unreadable_file") from None
    read = control_vector_file if data.startswith(GGUF_MAGIC) else steering_file
    try:
        file = read(path, hashlib.sha256(data).hexdigest())
    except Refusal:
        raise
    except Exception:  # whatever a reader makes of a file that is not its kind: it is no vector
        raise Refusal("steer_not_a_vector", file=path.name) from None
    return fitted(file, config)


def control_vector_file(path: Path, sha256: str) -> VectorFile:
    """A llama.cpp control vector that steers one layer (llama.cpp's own generator writes one for
    every layer: refused, saying how many)."""
    control = load_control_vector(path)
    steered = [layer for layer, v in control.directions.items() if torch.count_nonzero(v)]
    if len(steered) != 1:
        raise Refusal("steer_file_layers", file=path.name, count=len(steered))
    steering = control.steering()
    count = control.layer_count  # one direction a block but the first, as llama.cpp and this app write them
    return VectorFile(path.name, sha256, numbers(steering.vector), steering.layer, steering.strength, [], [],
                      control.model_hint, None if count is None else count + 1)


def steering_file(path: Path, sha256: str) -> VectorFile:
    """This app's safetensors steering vector."""
    saved = load_steering(path)
    steering = saved.steering
    return VectorFile(path.name, sha256, numbers(steering.vector), steering.layer, steering.strength,
                      list(saved.positive), list(saved.negative), saved.model, saved.n_layer)


def numbers(vector: torch.Tensor) -> list[float]:
    """A vector's numbers (a ValueError for anything but one row of finite numbers)."""
    if vector.dim() != 1 or not torch.isfinite(vector).all():
        raise ValueError("not a vector of finite numbers")
    return vector.float().tolist()


def fitted(file: VectorFile, config: GPT2Config) -> VectorFile:
    """`file`, refused where it does not fit the model served: another width, made for a model of
    another number of blocks, or steering after a block this one does not have; its strength held
    to what a run takes."""
    if len(file.vector) != config.n_embd:
        raise Refusal("steer_vector_width", file=file.name, width=len(file.vector), n_embd=config.n_embd)
    if file.n_layer is not None and file.n_layer != config.n_layer:
        raise Refusal("steer_vector_layers", file=file.name, layers=file.n_layer, n_layer=config.n_layer)
    if not 0 <= file.layer <= config.n_layer:
        raise Refusal("steer_vector_layer", file=file.name, layer=file.layer, n_layer=config.n_layer)
    low, high = LIMITS["steer_strength"]
    return dataclasses.replace(file, strength=min(max(file.strength, low), high))
