"""The Gradio API: each task as a named endpoint (/generate, /chat, /translate, /summarize), and the
Architecture tab's activation patching (/trace), whose parameters gradio_client documents from the
function's signature."""
from __future__ import annotations

from typing import Callable, Iterator

import gradio as gr

from serve.host import Host
from serve.messages import english, message_of
from serve.outcome import english_status
from serve.running import TaskAPI, public_logprobs

RETURNS = ("Returns (text, status line, prompt sent, logprobs: each generated token's {token, bytes, logprob, top} "
           "when logprobs > 0); streams.")


def api_endpoint(api: TaskAPI, host: Host) -> Callable[..., Iterator[tuple[str, str, str, list]]]:
    """The host's run as a function with the task's named, typed parameters, for `gr.api`, which
    documents an endpoint from its function's signature."""
    signature = api.signature

    def endpoint(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        for text, outcome, prompt, logprobs in host.run(api, bound.arguments):
            if outcome is not None and not outcome.ran:  # a refusal or a fault is answered as an error
                raise gr.Error(english(outcome.message), print_exception=False)
            yield text, english_status(outcome), prompt, public_logprobs(logprobs)

    endpoint.__name__ = endpoint.__qualname__ = api.name
    endpoint.__doc__ = f"{api.description} {RETURNS}"
    endpoint.__signature__ = signature
    endpoint.__annotations__ = {p.name: p.annotation for p in signature.parameters.values()}
    endpoint.__annotations__["return"] = signature.return_annotation
    return endpoint


def trace_endpoint(host: Host) -> Callable[..., dict]:
    """The host's trace as a function with named, typed parameters, for `gr.api`."""
    def trace(clean: str, corrupted: str = "", answer: str = "", noise_span: str = "") -> dict:
        """Activation patching: for each layer and position of `clean`, the clean run's activation
        restored into the corrupted run, and its normalised effect on the answer's probability,
        (p_patched - p_corrupted) / (p_clean - p_corrupted). `corrupted`: a prompt of as many tokens
        as `clean`; empty: noise on `noise_span`, a piece of `clean` (3 x the embeddings' std, 5
        seeded samples averaged). `answer`: one token; empty: the clean run's likeliest next token.
        Returns {tokens, layers, grid (positions x layers: each block's output, the residual
        stream), attention, mlp (the same for those outputs), p_clean, p_corrupted, answer, noised
        (the positions noised)}."""
        try:
            return host.trace(clean, corrupted, answer, noise_span).as_json()
        except ValueError as error:  # a refusal is answered as an error, in English
            raise gr.Error(english(message_of(error)), print_exception=False) from None
    return trace
