"""Load and save GPT-2 checkpoints in Hugging Face's layout.

A checkpoint is a directory with config.json, model.safetensors (or pytorch_model.bin, read
with torch.load(weights_only=True) and nothing else) and a tokenizer (vocab.json + merges.txt,
or a SentencePiece tokenizer.model). HF keeps attention and MLP projections as Conv1D with
weights [in, out]; they are transposed once here to nn.Linear's [out, in].
"""
from __future__ import annotations

import os
import re
import socket
import urllib.request
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlparse

import torch
from safetensors.torch import load_file, save_file

from .adapters import load_adapters
from .config import GPT2Config
from .gpt2 import GPT2
from .tokenizer import Tokenizer, load_tokenizer

BUNDLED_DIR = Path(__file__).resolve().parent.parent / "assets"
BUNDLED_NAMES = {None, "", "bundled"}
CONV1D_WEIGHTS = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer.model")
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
ADAPTERS_DIR = "adapters"  # <checkpoint>/adapters/<task>/ holds each task's PEFT adapter
HUB_CONNECT_TIMEOUT_S = 5  # how long to wait for the hub to answer before calling it unreachable
HUB_ID = re.compile(r"^[A-Za-z0-9_-][\w.-]*(/[\w.-]+)?$")  # "gpt2", "openai-community/gpt2-xl"


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded; the message names the file and the problem."""


def pick_device(name: str | torch.device = "auto") -> torch.device:
    """"auto": a GPU where there is one, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def load_pretrained(name_or_path: str | os.PathLike | None = None, device: str | torch.device = "cpu",
                    dtype: torch.dtype = torch.float32) -> tuple[GPT2, Tokenizer]:
    """Model and tokenizer from a local directory, a hub id, or (with no name) the bundled model.

    Adapters in the checkpoint's adapters/ folder are loaded too (see model.adapters).
    """
    directory = resolve_checkpoint(name_or_path)
    config = GPT2Config.load(directory)
    # Built on the meta device, with no memory and no random initialisation, then given the
    # file's tensors themselves (assign): every weight comes from the checkpoint (to_our_layout
    # refuses one that lacks any), and nothing is initialised only to be overwritten.
    with torch.device("meta"):
        model = GPT2(config)
    weights_path = next((directory / f for f in WEIGHT_FILES if (directory / f).is_file()), None)
    if weights_path is None:
        raise CheckpointError(f"{directory}: no weights file (looked for {' or '.join(WEIGHT_FILES)})")
    weights = read_weights(weights_path)
    model.load_state_dict(to_our_layout(weights, model, weights_path), assign=True)
    model.tie_head()  # assign gave the head a parameter of its own
    model.to(device=pick_device(device), dtype=dtype).eval()
    # What is still the file's own tensor (safetensors maps the file) becomes the model's memory,
    # so that the file is let go; so do Conv1D's transposed views, in nn.Linear's memory order.
    from_file = {tensor.untyped_storage().data_ptr() for tensor in weights.values()}
    for p in model.parameters():
        if not p.is_contiguous() or p.untyped_storage().data_ptr() in from_file:
            p.data = p.data.clone(memory_format=torch.contiguous_format)
    load_adapters(model, directory / ADAPTERS_DIR)  # after the move: adapters follow the base's device and dtype
    return model, load_tokenizer(directory)


def accept_any(directory: Path) -> None:
    """resolve_checkpoint's default check: every checkpoint is wanted."""


def resolve_checkpoint(name_or_path, check_config: Callable[[Path], None] = accept_any) -> Path:
    """The local directory that holds a checkpoint, downloading from the hub when needed.

    check_config(the directory that holds config.json) may raise to refuse the checkpoint before
    its weights are downloaded (a server checks that they fit in its memory)."""
    if name_or_path in BUNDLED_NAMES:
        check_config(BUNDLED_DIR)
        return BUNDLED_DIR
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        check_config(path)
        return path
    if path.exists():
        raise CheckpointError(f"{path}: is a file; expected a checkpoint directory")
    if not HUB_ID.match(str(name_or_path)):
        raise CheckpointError(f"{path}: directory does not exist")
    return download_from_hub(str(name_or_path), check_config)


def download_from_hub(repo_id: str, check_config: Callable[[Path], None] = accept_any) -> Path:
    """Fetch a GPT-2 repo's files through huggingface_hub, from the local cache first; config.json
    first, which check_config reads before the weights come."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (HfHubHTTPError, LocalEntryNotFoundError, RemoteEntryNotFoundError,
                                        RepositoryNotFoundError)
    unreachable = None  # known once a file is not in the cache

    def fetch(filename: str) -> Path | None:
        """The file's local path, or None when the repo lacks it or it cannot be had offline."""
        nonlocal unreachable
        try:
            return Path(hf_hub_download(repo_id, filename, local_files_only=True))
        except LocalEntryNotFoundError:
            pass
        except ValueError as e:  # a malformed repo id
            raise CheckpointError(f"{repo_id}: not a local directory nor a valid hub id ({e})") from None
        if unreachable is None:
            unreachable = not hub_reachable()
        if unreachable:
            return None
        try:
            return Path(hf_hub_download(repo_id, filename))
        except RemoteEntryNotFoundError:
            return None
        except LocalEntryNotFoundError:  # not cached, and the hub cannot be reached
            unreachable = True
            return None
        except RepositoryNotFoundError:
            raise CheckpointError(f"{repo_id}: no such local directory nor hub repository") from None
        except HfHubHTTPError as e:
            raise CheckpointError(f"{repo_id}: the hub refused {filename}: {e}") from None

    config = fetch("config.json")
    if config is not None:
        check_config(config.parent)
    weights = next((path for path in map(fetch, WEIGHT_FILES) if path is not None), None)
    if config is None or weights is None:
        if unreachable:
            raise CheckpointError(
                f"{repo_id}: no such local directory, not in the local Hugging Face cache, and the hub cannot be "
                "reached (offline?). Download it once with network access, or pass a local directory "
                "(HF_HUB_OFFLINE=1 skips the hub and uses the cache alone).")
        missing = "config.json" if config is None else " or ".join(WEIGHT_FILES)
        raise CheckpointError(f"{repo_id}: the hub repo has no {missing}")
    for extra in TOKENIZER_FILES:
        fetch(extra)
    return config.parent


def hub_reachable() -> bool:
    """Whether the hub (HF_ENDPOINT) takes a connection within HUB_CONNECT_TIMEOUT_S; False when
    HF_HUB_OFFLINE is set. Asked before any download: huggingface_hub retries a refused or silent
    connection for a minute or more before it gives up. Behind a proxy the proxy is asked."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    endpoint = urlparse(constants.ENDPOINT)
    via = urllib.request.getproxies().get(endpoint.scheme)
    target = urlparse(via) if via and not urllib.request.proxy_bypass(endpoint.hostname or "") else endpoint
    port = target.port or (443 if target.scheme == "https" else 80)
    try:
        socket.create_connection((target.hostname, port), timeout=HUB_CONNECT_TIMEOUT_S).close()
        return True
    except (OSError, ValueError):  # refused, timed out, or a name that does not resolve
        return False


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    try:
        if path.suffix == ".safetensors":
            return load_file(path)
        # weights_only refuses arbitrary pickled objects: only tensors and plain containers load.
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # safetensors and torch raise many types for damaged files
        raise CheckpointError(f"{path}: weights file is truncated or corrupt ({type(e).__name__}: {e})") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path}: does not hold a dictionary of tensors")
    return state


def to_our_layout(hf_state: dict[str, torch.Tensor], model: GPT2, source: Path) -> dict[str, torch.Tensor]:
    """Rename HF keys (with or without the 'transformer.' prefix), transpose Conv1D, check shapes."""
    state = {}
    for key, tensor in hf_state.items():
        key = key.removeprefix("transformer.")
        if key.endswith((".attn.bias", ".attn.masked_bias")) or key == "lm_head.weight":
            continue  # HF's causal-mask buffers, and the head that is tied to wte
        if key.endswith(CONV1D_WEIGHTS):
            tensor = tensor.t()
        state["transformer." + key] = tensor
    expected = {k: v.shape for k, v in model.state_dict().items() if k != "lm_head.weight"}
    missing = sorted(expected.keys() - state.keys())
    if missing:
        raise CheckpointError(f"{source}: missing tensors for this config: {', '.join(missing[:5])}"
                              + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""))
    unexpected = sorted(state.keys() - expected.keys())
    if unexpected:
        raise CheckpointError(f"{source}: tensors this config does not have: {', '.join(unexpected[:5])}")
    for key, shape in expected.items():
        if state[key].shape != shape:
            raise CheckpointError(f"{source}: tensor {key} has shape {tuple(state[key].shape)}, "
                                  f"config.json implies {tuple(shape)}")
    state["lm_head.weight"] = state["transformer.wte.weight"]
    return state


def save_pretrained(model: GPT2, tokenizer: Tokenizer | None, path: str | os.PathLike) -> Path:
    """Write config.json, model.safetensors and the tokenizer files in HF GPT-2 layout."""
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    model.config.save(directory)
    state = {}
    for key, tensor in model.state_dict().items():
        if key == "lm_head.weight":
            continue  # tied to wte; HF re-ties it on load
        if key.endswith(CONV1D_WEIGHTS):
            tensor = tensor.t()
        state[key] = tensor.detach().to("cpu").contiguous()
    save_file(state, directory / "model.safetensors", metadata={"format": "pt"})
    if tokenizer is not None:
        tokenizer.save(directory)
    return directory
