"""The live view's numbers against transformers' GPT2LMHeadModel, the reference, run on the same
checkpoint: residual norms from forward hooks on its blocks and ln_f, attention from its eager
attention (output_attentions), next-token probabilities from its logits."""
from __future__ import annotations

import threading

import pytest
import torch

from model import load_pretrained
from engine.residual import recording_outputs
from serve.inspection import MAX_TOKENS, inspect_prompt

from .conftest import refused, write_small_bpe

PROMPT = "The little fox looked at the moon and said"


@pytest.fixture(scope="module")
def peaked_checkpoint(tmp_path_factory):
    """A 3-layer, 4-head HF GPT-2 whose q and k weights are large enough for attention to be far
    from uniform, so that a wrong head, scale or mask shows up in the comparison."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    hf = GPT2LMHeadModel(GPT2Config(n_positions=128, n_embd=64, n_layer=3, n_head=4))
    with torch.no_grad():
        for block in hf.transformer.h:
            block.attn.c_attn.weight[:, :128].normal_(0, 0.4)  # Conv1D [in, out]: q and k columns
            block.ln_1.weight.normal_(1, 0.5)  # uneven gains: norms differ across layers
    directory = tmp_path_factory.mktemp("peaked")
    hf.save_pretrained(directory)
    write_small_bpe(directory)
    return directory


@pytest.fixture(scope="module")
def reference(peaked_checkpoint):
    from transformers import GPT2LMHeadModel

    return GPT2LMHeadModel.from_pretrained(peaked_checkpoint, attn_implementation="eager").eval()


@pytest.fixture(scope="module")
def ours(peaked_checkpoint):
    return load_pretrained(peaked_checkpoint)


def reference_run(hf, ids: list[int]):
    """Norms of the residual stream after the embeddings, each block and ln_f, recorded by hooks;
    attention probabilities; logits."""
    outputs = []

    def keep(module, inputs, output):
        outputs.append(output[0] if isinstance(output, tuple) else output)

    modules = [*hf.transformer.h, hf.transformer.ln_f]
    handles = [m.register_forward_hook(keep) for m in modules]
    try:
        with torch.no_grad():
            out = hf(torch.tensor([ids]), output_hidden_states=True, output_attentions=True)
    finally:
        for h in handles:
            h.remove()
    stream = [out.hidden_states[0], *outputs]
    return torch.stack([h[0].norm(dim=-1) for h in stream]), out.attentions, out.logits[0, -1]


def test_residual_norms_attention_and_top_tokens_match_transformers(ours, reference):
    model, tokenizer = ours
    ids = tokenizer.encode(PROMPT)
    norms, attentions, logits = reference_run(reference, ids)
    for layer in range(3):
        for head in range(4):
            seen = inspect_prompt(model, tokenizer, PROMPT, layer=layer, head=head)
            torch.testing.assert_close(seen.attention, attentions[layer][0, head], atol=1e-5, rtol=1e-4)
    assert seen.attention.max() > 0.9  # peaked, so the comparison above could tell heads apart
    torch.testing.assert_close(seen.attention.sum(-1), torch.ones(len(ids)))
    torch.testing.assert_close(seen.residual_norms, norms, atol=1e-4, rtol=1e-5)
    assert seen.residual_norms.shape == (3 + 2, len(ids))

    expected = logits.softmax(-1).topk(10)
    assert [token for token, _ in seen.top_tokens] == [
        tokenizer.token_bytes(i).decode("utf-8", errors="replace").replace(" ", "␣")
        for i in expected.indices.tolist()]
    torch.testing.assert_close(torch.tensor([p for _, p in seen.top_tokens]), expected.values, atol=1e-6, rtol=1e-5)
    assert seen.tokens[1] == "␣little"


def test_attention_map_belongs_to_the_chosen_layer_and_head(ours):
    model, tokenizer = ours
    maps = [inspect_prompt(model, tokenizer, PROMPT, layer, head).attention for layer in range(3) for head in range(4)]
    assert all(not torch.allclose(a, b, atol=1e-3) for i, a in enumerate(maps) for b in maps[i + 1:])
    assert all(bool((m.triu(1) == 0).all()) for m in maps)  # no token attends to a later one


def test_bad_requests_say_what_is_wrong(ours):
    model, tokenizer = ours
    with pytest.raises(ValueError, match="layers 1-3 and heads 1-4"):
        inspect_prompt(model, tokenizer, PROMPT, layer=3)
    with refused("prompt_empty_tokens"):
        inspect_prompt(model, tokenizer, "")
    with refused("live_view_tokens", most=MAX_TOKENS):
        inspect_prompt(model, tokenizer, "word " * (MAX_TOKENS + 1))


def test_forward_calls_of_other_threads_are_not_recorded(ours):
    """The app generates with the same model in other threads while a user looks inside it."""
    model, tokenizer = ours
    ids = torch.tensor([tokenizer.encode(PROMPT)])
    with recording_outputs([model.transformer.ln_f]) as outputs:
        other = threading.Thread(target=lambda: model(ids))
        other.start()
        other.join()
        assert outputs == [None]
        model(ids[:, :3])
    assert outputs[0].shape == (1, 3, 64)


def test_a_piece_of_a_character_is_labelled_by_its_bytes(ours):
    from serve.inspection import token_label

    _, tokenizer = ours
    ids = tokenizer.encode("🙂 ok")  # GPT-2's bytes split the emoji into tokens that are no text alone
    labels = [token_label(tokenizer, id) for id in ids]
    assert "\ufffd" not in "".join(labels)
    assert "".join(labels).startswith("\\xf0\\x9f") and labels[-1] == "␣ok"
    assert b"".join(tokenizer.token_bytes(id) for id in ids[:-1]) == "🙂".encode()
