"""Activation patching (engine/patching.py): restoring the stream the head reads gives exactly 1,
restoring nothing 0, and one cell is what the same patch gives done with hooks on transformers'
GPT2LMHeadModel of the same weights."""
from __future__ import annotations

import pytest
import torch

from engine.patching import KINDS, Patching
from model import load_pretrained

CLEAN = [11, 523, 87, 4051, 300, 9, 77, 1200]
CORRUPTED = [11, 523, 87, 4051, 301, 9, 77, 1200]  # one token changed, at position 4
FIRST_CHANGED = 4


@pytest.fixture(scope="module")
def tiny(tiny_checkpoint):
    model, tokenizer = load_pretrained(str(tiny_checkpoint), device="cpu")
    return model.eval(), tokenizer


@pytest.fixture(scope="module")
def patching(tiny) -> Patching:
    return Patching(tiny[0], CLEAN, CORRUPTED)


def test_restoring_the_stream_the_head_reads_gives_exactly_one(patching):
    grid = patching.grid("residual")
    assert grid.shape == (len(CLEAN), patching.model.config.n_layer)
    assert grid[-1, -1].item() == 1.0
    # at the last layer, any other position leaves the stream the head reads as the corrupted run's
    assert (grid[:-1, -1] == 0).all()


@pytest.mark.parametrize("kind", KINDS)
def test_restoring_nothing_gives_zero(patching, kind):
    layers = patching.model.config.n_layer
    nothing = torch.zeros(1, len(CLEAN), dtype=torch.bool)
    for layer in range(layers):
        assert patching.effects(kind, layer, nothing).item() == 0.0
    # nor does restoring a position before the first corrupted one: the two runs agree there
    assert (patching.grid(kind)[:FIRST_CHANGED] == 0).all()


def test_the_corrupted_prompt_must_have_as_many_tokens(tiny):
    with pytest.raises(ValueError, match="7 tokens, the clean one 8"):
        Patching(tiny[0], CLEAN, CORRUPTED[:-1])


def hf_effect(checkpoint, kind: str, layer: int, position: int) -> float:
    """The same patch with forward hooks on transformers' GPT2LMHeadModel: record the clean run's
    output of block `layer` (or of its attention or MLP), put it back at `position` in the
    corrupted run, and normalise the answer's probability."""
    from transformers import GPT2LMHeadModel

    hf = GPT2LMHeadModel.from_pretrained(checkpoint).eval()
    block = hf.transformer.h[layer]
    module = {"residual": block, "attention": block.attn, "mlp": block.mlp}[kind]

    def first(output):
        return output[0] if isinstance(output, tuple) else output

    def probabilities(ids, hook=None):
        handle = module.register_forward_hook(hook) if hook else None
        try:
            with torch.no_grad():
                return hf(torch.tensor([ids])).logits[0, -1].softmax(-1)
        finally:
            if handle:
                handle.remove()

    kept = {}
    clean = probabilities(CLEAN, lambda m, i, o: kept.update(value=first(o).clone()))
    answer = int(clean.argmax())

    def restore(m, i, output):
        patched = first(output).clone()
        patched[:, position] = kept["value"][:, position]
        return (patched, *output[1:]) if isinstance(output, tuple) else patched

    corrupted = probabilities(CORRUPTED)[answer]
    patched = probabilities(CORRUPTED, restore)[answer]
    return float((patched - corrupted) / (clean[answer] - corrupted))


@pytest.mark.parametrize("kind,layer,position", [("residual", 0, FIRST_CHANGED), ("attention", 0, 6),
                                                 ("mlp", 1, 7)])
def test_one_cell_is_the_same_patch_done_with_hooks_on_transformers(tiny_checkpoint, patching, kind, layer, position):
    ours = patching.grid(kind)[position, layer].item()
    assert ours == pytest.approx(hf_effect(tiny_checkpoint, kind, layer, position), abs=1e-4)
    assert abs(ours) > 1e-3  # a cell the patch moves, so that the comparison means something


def test_noise_on_a_span_is_seeded_and_its_samples_averaged(tiny):
    model, _ = tiny
    first, again = (Patching(model, CLEAN, noised=[2, 3]) for _ in range(2))
    assert first.samples == 5
    assert first.p_corrupted == again.p_corrupted != first.p_clean
    grid = first.grid("residual")
    assert torch.equal(grid, again.grid("residual"))
    assert grid[-1, -1].item() == 1.0 and (grid[:2] == 0).all()  # before the noise: the same stream
    other_seed = Patching(model, CLEAN, noised=[2, 3], seed=1)
    assert other_seed.p_corrupted != first.p_corrupted


def test_progress_is_told_after_each_layer_of_each_kind(patching):
    told = []
    grids = patching.grids(lambda done, total: told.append((done, total)))
    layers = patching.model.config.n_layer
    assert set(grids) == set(KINDS)
    assert told == [(i + 1, 3 * layers) for i in range(3 * layers)]


# --- as the app serves it: serve/tracing.py, ModelHost.trace, /studio/trace, RemoteHost, /trace ----

CLEAN_TEXT = "the cat sat on the mat and the dog"
KEYS = {"tokens", "layers", "grid", "attention", "mlp", "p_clean", "p_corrupted"}


@pytest.fixture(scope="module")
def host(tiny_checkpoint):
    from serve.model_host import ModelHost
    return ModelHost([str(tiny_checkpoint)], device="cpu")


def refused(call) -> str:
    from serve.messages import english, message_of
    with pytest.raises(ValueError) as caught:
        call()
    return english(message_of(caught.value))


def test_a_trace_of_two_prompts_of_as_many_tokens(host):
    tokenizer = host.current.tokenizer
    corrupted = "the dog sat on the mat and the cat"
    assert len(tokenizer.encode(corrupted)) == len(tokenizer.encode(CLEAN_TEXT))
    told = []
    trace = host.trace(CLEAN_TEXT, corrupted, progress=lambda done, total: told.append(done))
    layers = host.current.config.n_layer
    assert len(trace.tokens) == len(tokenizer.encode(CLEAN_TEXT)) and trace.layers == layers
    for grid in (trace.grid, trace.attention, trace.mlp):
        assert grid.shape == (len(trace.tokens), layers)
    assert trace.grid[-1, -1].item() == 1.0 and trace.p_clean != trace.p_corrupted and trace.noised == []
    assert told == list(range(1, 3 * layers + 1))
    answer = trace.answer.replace("␣", " ")  # the answer named: the same trace again
    again = host.trace(CLEAN_TEXT, corrupted, answer)
    assert torch.equal(again.grid, trace.grid) and again.p_clean == trace.p_clean


def test_prompts_of_different_token_counts_are_refused_naming_both(host):
    tokenizer = host.current.tokenizer
    clean, corrupted = (len(tokenizer.encode(text)) for text in (CLEAN_TEXT, "the cat sat"))
    assert refused(lambda: host.trace(CLEAN_TEXT, "the cat sat")) == (
        f"the corrupted prompt has {corrupted} tokens and the clean prompt {clean}: a trace needs as many in both")


def test_noise_on_a_span_of_the_clean_prompt_is_reproducible(host):
    first, again = (host.trace(CLEAN_TEXT, noise_span="cat sat") for _ in range(2))
    tokens = first.tokens
    assert first.noised and all("cat" in tokens[i] or "sat" in tokens[i] for i in first.noised)
    assert first.as_json() == again.as_json()
    assert first.grid[: first.noised[0]].abs().max().item() == 0  # before the noise nothing differs


def test_what_a_trace_refuses(host):
    assert refused(lambda: host.trace(CLEAN_TEXT)) == (
        "give a corrupted prompt, or a noise span: a piece of the clean prompt to add noise to")
    assert refused(lambda: host.trace(CLEAN_TEXT, noise_span="zebra")) == (
        "the noise span 'zebra' is not in the clean prompt")
    assert refused(lambda: host.trace(CLEAN_TEXT, CLEAN_TEXT)).startswith(
        "the corruption leaves the probability of the answer")
    assert refused(lambda: host.trace("", "the")) == "clean prompt is empty"
    assert refused(lambda: host.trace(CLEAN_TEXT, answer="the cat sat", noise_span="cat")).startswith(
        "the answer must be one token; 'the cat sat' is ")
    assert refused(lambda: host.trace(3)) == "clean prompt must be text, got int"
    assert refused(lambda: host.trace("the " * 100, noise_span="the")).endswith("a trace takes at most 64")


def test_studio_trace_and_a_remote_host_in_front_of_it(host):
    from fastapi.testclient import TestClient

    from serve.backend import RemoteHost
    from serve.replica import replica_app

    client = TestClient(replica_app(host, "replica-1"))
    answer = client.post("/studio/trace", json={"clean": CLEAN_TEXT, "corrupted": "", "answer": "",
                                                "noise_span": "cat"})
    assert answer.status_code == 200 and KEYS <= set(answer.json())
    local = host.trace(CLEAN_TEXT, noise_span="cat").as_json()
    assert answer.json() == local
    refusal = client.post("/studio/trace", json={"clean": CLEAN_TEXT, "corrupted": "the cat"})
    assert refusal.status_code == 400 and refusal.json()["refused"]["key"] == "trace_lengths"

    remote = object.__new__(RemoteHost)  # a RemoteHost whose HTTP client is the replica's app in-process
    remote.url, remote.http = "http://testserver", client
    assert remote.trace(CLEAN_TEXT, noise_span="cat").as_json() == local
    assert refused(lambda: remote.trace(CLEAN_TEXT, "the cat")) == refused(lambda: host.trace(CLEAN_TEXT, "the cat"))


@pytest.mark.slow  # Gradio's import, and the app served
def test_the_gradio_endpoint_trace(host):
    from gradio_client import Client
    from gradio_client.exceptions import AppError

    from tests.conftest import serve_studio

    with serve_studio(host) as url:
        client = Client(url, verbose=False)
        answer = client.predict(clean=CLEAN_TEXT, corrupted="", answer="", noise_span="cat", api_name="/trace")
        assert answer == host.trace(CLEAN_TEXT, noise_span="cat").as_json()
        with pytest.raises(AppError, match="tokens and the clean prompt"):
            client.predict(clean=CLEAN_TEXT, corrupted="the cat", api_name="/trace")
