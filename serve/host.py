"""One interface for where the model runs: in this process (ModelHost, model_host.py) or on a
deployment's replicas (RemoteHost, backend.py). The page, its Gradio API and the replicas' routes
call a host through it and never ask which one they have."""
from __future__ import annotations

import threading
from typing import Any, Callable, Iterator, Protocol

from model import GPT2Config

from .admission import RunQueue, Waiting
from .comparing import Comparison
from .messages import Message
from .outcome import Outcome
from .running import LiveView, TaskAPI
from .tracing import Trace
from .vectors import SteeringVector

# One update of a run: (text so far, outcome (None until the last), prompt sent, logprobs).
RunUpdate = tuple[str, Outcome | None, str, list]
# One update of a comparison: (both texts so far, outcome, comparison (None until the last)).
CompareUpdate = tuple[list[str], Outcome | None, Comparison | None]


class ServedModel(Protocol):
    """What the page shows of the model being served."""
    name: str

    @property
    def config(self) -> GPT2Config: ...

    @property
    def context(self) -> int: ...

    @property
    def adapters(self) -> list[str]: ...

    @property
    def adapters_on(self) -> list[str]: ...

    @property
    def decode_path(self) -> str: ...

    def describe(self, lang: str = "en") -> str:
        """The model line, in Markdown, in `lang`."""


class Host(Protocol):
    names: tuple[str, ...]  # the models it can serve, the first at start
    loading: str | None  # the model being loaded to switch to, while it loads
    allow_load: bool  # whether `load` and `unload` may change `names`
    queue: RunQueue  # where every run takes its turn, whoever sent it (admission.py)

    @property
    def current(self) -> ServedModel: ...

    def switch(self, name: str) -> ServedModel:
        """Serve `name` from now on (a ModelLoadError where it cannot be had; the current stays)."""

    def load(self, name: str, progress: Callable[[str], None] = ...) -> ServedModel:
        """Add `name` (a hub id or a local checkpoint directory) to `names` and serve it from now on,
        telling `progress` each step (model_host.LOAD_STEPS); a ModelLoadError where it cannot be
        had or loading is not allowed (the current stays)."""

    def unload(self, name: str) -> ServedModel:
        """Take `name` off `names` and free its memory, serving another first where it is served;
        returns the model served (a ModelLoadError where loading is not allowed)."""

    def settling(self) -> bool:
        """Whether the model line may still change by itself (the decode kernels build)."""

    def run(self, api: TaskAPI, values: dict[str, Any], cancel: threading.Event | None = None,
            waiting: bool = False) -> Iterator[RunUpdate | Waiting]:
        """One request's updates, at most MAX_UPDATES_PER_SECOND a second, the last with its outcome:
        done, refused (the field and why, or a full queue), a fault, or stopped (`cancel`). Before
        them, with `waiting`, its place in the queue while it waits for its turn."""

    def run_compare(self, api: TaskAPI, values: dict[str, Any], cancel: threading.Event | None = None,
                    waiting: bool = False) -> Iterator[CompareUpdate | Waiting]:
        """The request twice under one seed, the two sides differing in what values["compare"] names
        (serve/comparing.py: "adapter", "steering", "model:<id>" or "setting:<name>=<value>"), as
        `run` streams one; the last update has the shown side's outcome and the Comparison."""

    def steering_vector(self, values: dict[str, Any]) -> SteeringVector:
        """The vector a request's steering (its steer_* values) adds, for serve/vectors.py to write as
        files; a ValueError naming the field where refused, or where it asks for no steering."""

    def look_inside(self, prompt: Any, layer: Any, head: Any, adapter: str | None) -> LiveView:
        """The Architecture tab's live view of `prompt`; a ValueError naming the field where refused."""

    def trace(self, clean: Any, corrupted: Any = "", answer: Any = "", noise_span: Any = "",
              progress: Callable[[int, int], None] | None = None) -> Trace:
        """Activation patching of `clean` against `corrupted` (empty: noise on `noise_span`, a piece
        of `clean`) for `answer` (empty: the clean run's likeliest next token): serve/tracing.py's
        Trace; a ValueError naming the field where refused. progress(done, total) as it goes, where
        the host can tell."""

    def article_room(self, article: str, max_new_tokens: int, adapter: bool) -> list[Message]:
        """What a summary's prompt would take of the context, and what it would cut, as messages
        (none where the tokenizer is not here); a ValueError where a run would refuse the article."""

    def conversation_room(self, message: Any, history: Any, persona: Any, max_new_tokens: Any) -> list[Message]:
        """What the prompt of a conversation's next message would take of the context, and the
        oldest turns it would leave out, as messages (none where the tokenizer is not here); a
        ValueError where a run would refuse the conversation."""
