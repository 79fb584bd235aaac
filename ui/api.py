"""The Gradio API: each task as a named endpoint (/generate, /chat, /translate, /summarize) whose
parameters gradio_client documents from the function's signature."""
from __future__ import annotations

from typing import Callable, Iterator

import gradio as gr

from serve.host import Host
from serve.messages import english
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
