"""The Gradio API: each task as a named endpoint (/generate, /chat, /translate, /summarize), one
comparison of two runs of any of them (/compare), and the Architecture tab's activation patching
(/trace), whose parameters gradio_client documents from the function's signature."""
from __future__ import annotations

from typing import Callable, Iterator

import gradio as gr

from serve.apis import APIS
from serve.comparing import public_comparison
from serve.host import Host
from serve.limits import brief
from serve.messages import Message, english, message_of
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


def compare_endpoint(host: Host) -> Callable[..., dict]:
    """The host's comparison (serve/comparing.py) as a function with named, typed parameters, for `gr.api`."""
    def compare(task: str, compare: str, values: dict | None = None) -> dict:
        """One request of a task run twice at once under one seed, the two sides differing in what
        `compare` names: "adapter" (off, then on), "steering" (off, then on; `values` must steer),
        "model:<id>" (the model served, then <id>, another of the app's models) or
        "setting:<name>=<value>" (the settings as given, then <name> at <value>: temperature,
        top_k, ...). `task`: generate, chat, translate or summarize; `values`: that endpoint's own
        parameters by name, as it takes them (the rest its defaults). Returns {"sides": [{"label",
        "text", "logprobs", "under_other", "status", "first_difference"}, ...], "first_difference"
        (the first side's first token where they part, null where they do not), "by_text" (whether the
        models' tokenizers differ, so the texts were compared), "first_difference_character" (there:
        the first character where the texts part), "shown" (the side a run without compare gives),
        "compare", "status"}."""
        api = APIS.get(task) if isinstance(task, str) else None
        if api is None:
            refused = Message.keyed("one_of", name="task", choices=", ".join(APIS), value=brief(task))
            raise gr.Error(english(refused), print_exception=False)
        asked = {} if values is None else values  # not an object: the host refuses it, naming `values`
        if isinstance(asked, dict):
            asked = {**asked, "compare": compare}
        *_, (texts, outcome, comparison) = host.run_compare(api, asked)
        if not outcome.ran:
            raise gr.Error(english(outcome.message), print_exception=False)
        return public_comparison(texts, outcome, comparison)
    return compare
