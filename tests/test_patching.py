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
