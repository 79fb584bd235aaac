"""Every way a checkpoint can be wrong gets a message that names the file and the problem."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys

import pytest
import torch

from model import load_pretrained
from model.checkpoint import CheckpointError

from .conftest import REPO, make_hf_checkpoint


@pytest.fixture
def checkpoint(tmp_path):
    return make_hf_checkpoint(tmp_path / "ckpt", n_positions=32, n_embd=16, n_layer=1, n_head=2)


def test_directory_that_does_not_exist(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(CheckpointError, match=f"{missing}: directory does not exist"):
        load_pretrained(missing)


def test_no_weights_file(checkpoint):
    (checkpoint / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no weights file .*model.safetensors or pytorch_model.bin"):
        load_pretrained(checkpoint)


def test_truncated_safetensors(checkpoint):
    weights = checkpoint / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:5000])
    with pytest.raises(CheckpointError, match="model.safetensors: weights file is truncated or corrupt"):
        load_pretrained(checkpoint)


def test_corrupt_bin(checkpoint):
    (checkpoint / "model.safetensors").unlink()
    (checkpoint / "pytorch_model.bin").write_bytes(b"this is not a torch file")
    with pytest.raises(CheckpointError, match="pytorch_model.bin: weights file is truncated or corrupt"):
        load_pretrained(checkpoint)


class Sneaky:
    def __reduce__(self):
        return (print, ("unpickled!",))


def test_bin_with_arbitrary_objects_is_not_unpickled(checkpoint, capsys):
    (checkpoint / "model.safetensors").unlink()
    torch.save({"x": Sneaky()}, checkpoint / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="pytorch_model.bin"):
        load_pretrained(checkpoint)
    assert "unpickled!" not in capsys.readouterr().out


def test_config_that_is_not_gpt2(checkpoint):
    config = json.loads((checkpoint / "config.json").read_text())
    config["model_type"] = "llama"
    (checkpoint / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="config.json: model_type is 'llama', not 'gpt2'"):
        load_pretrained(checkpoint)


def test_config_that_is_not_json(checkpoint):
    (checkpoint / "config.json").write_text("{ not json")
    with pytest.raises(ValueError, match="config.json: not valid JSON"):
        load_pretrained(checkpoint)


def test_shapes_that_do_not_match_the_config(checkpoint):
    config = json.loads((checkpoint / "config.json").read_text())
    config["n_embd"] = 32
    (checkpoint / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"model.safetensors: tensor transformer.wte.weight has "
                                              r"shape \(50257, 16\), config.json implies \(50257, 32\)"):
        load_pretrained(checkpoint)


def test_missing_tensors(checkpoint, tmp_path):
    config = json.loads((checkpoint / "config.json").read_text())
    config["n_layer"] = 2
    (checkpoint / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="missing tensors for this config: transformer.h.1"):
        load_pretrained(checkpoint)


def test_no_tokenizer(checkpoint):
    for name in ("vocab.json", "merges.txt"):
        (checkpoint / name).unlink()
    with pytest.raises(FileNotFoundError, match=str(checkpoint)):
        load_pretrained(checkpoint)


def test_hub_id_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(CheckpointError, match="distilgpt2: no such local directory, not in the local Hugging Face "
                                              "cache, and the hub cannot be reached"):
        load_pretrained("distilgpt2")


@pytest.mark.slow  # waits out a network time-out
def test_an_unreachable_hub_fails_fast_with_the_offline_message(tmp_path):
    """The hub pointed at a loopback port where nothing listens (a socket bound, never listening,
    so the port stays closed): the load fails at once with the offline message, rather than after
    huggingface_hub's minute of retries. In a fresh interpreter, which reads HF_ENDPOINT at import."""
    code = """
import time
from model import load_pretrained
from model.checkpoint import CheckpointError
start = time.perf_counter()
try:
    load_pretrained("distilgpt2")
except CheckpointError as error:
    print(f"{time.perf_counter() - start:.1f}", error)
"""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        env = {**os.environ, "HF_ENDPOINT": f"http://127.0.0.1:{port}", "HF_HUB_CACHE": str(tmp_path / "cache")}
        env.pop("HF_HUB_OFFLINE", None)
        done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    seconds, message = done.stdout.strip().split(" ", 1)
    assert "distilgpt2: no such local directory, not in the local Hugging Face cache, and the hub cannot be " \
           "reached" in message
    assert float(seconds) < 15


def test_hub_id_from_local_cache(tmp_path, monkeypatch, checkpoint):
    """A hub id that is in the local cache loads offline, from the cache."""
    import huggingface_hub.constants as constants

    cache = tmp_path / "cache"
    snapshot = cache / "models--someone--tiny-gpt2" / "snapshots" / ("0" * 40)
    shutil.copytree(checkpoint, snapshot)
    (cache / "models--someone--tiny-gpt2" / "refs").mkdir()
    (cache / "models--someone--tiny-gpt2" / "refs" / "main").write_text("0" * 40)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    model, tokenizer = load_pretrained("someone/tiny-gpt2")
    assert model.config.n_embd == 16 and tokenizer.vocab_size == 50257
