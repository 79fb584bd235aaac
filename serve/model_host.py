"""The one place that holds the model every request runs on.

The app is started with a list of models (the bundled one, hub ids, local directories); the
first is loaded, and the UI may switch among the others, never to a path typed in the browser.
Each request takes `host.current` once, at its start, so a switch never changes a request that
is already running. Each loaded model has its own Scheduler, which decodes the requests running
on it in one batch (see engine/scheduler.py).
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Sequence

from engine import kernels, prepare_for_serving
from engine.scheduler import Scheduler, in_thread_of_its_own
from model import GPT2, load_pretrained
from model.adapters import adapter_names, adapters_on_by_default
from model.checkpoint import pick_device
from model.tokenizer import Tokenizer

from .messages import MODEL_LINE, MODEL_LINE_DECODING, MODEL_LINE_QUANTIZED, localized

BUNDLED = "bundled"
log = logging.getLogger(__name__)


class ModelLoadError(ValueError):
    """A model could not be loaded; the message says which and why."""


@dataclass(frozen=True)
class LoadedModel:
    name: str  # as given at start-up
    model: GPT2
    tokenizer: Tokenizer
    scheduler: Scheduler  # what requests generate through
    quantize: str | None = None

    @property
    def config(self):
        return self.model.config

    @property
    def context(self) -> int:
        return self.model.config.n_positions

    @property
    def adapters(self) -> list[str]:
        return adapter_names(self.model)

    @property
    def adapters_on(self) -> list[str]:
        """The adapters the checkpoint's evaluation found better than the prompt alone."""
        return adapters_on_by_default(self.model)

    @property
    def decode_path(self) -> str:
        """Which path decodes this model now, in words: its device where that is not the CPU."""
        return kernels.decode_path() if self.model.device.type == "cpu" else str(self.model.device)

    def describe(self, lang: str = "en") -> str:
        """One Markdown line in `lang`: what is loaded, for the model panel."""
        device = self.model.device
        line = MODEL_LINE[lang].format(
            name=self.name, millions=f"{self.model.num_parameters() / 1e6:.1f}", context=self.context,
            tokenizer=self.tokenizer.name, vocab=f"{self.tokenizer.vocab_size:,}",
            adapters=", ".join(self.adapters) or localized("none", lang), device=device)
        if self.quantize:
            line += MODEL_LINE_QUANTIZED[lang].format(quantize=self.quantize)
        if device.type == "cpu":
            line += MODEL_LINE_DECODING[lang].format(path=localized(self.decode_path, lang))
        return line


class ModelHost:
    remote = False  # the model is here (a RemoteHost's is on another machine: serve/backend.py)

    def __init__(self, names: Sequence[str], device: str = "auto", quantize: str | None = None):
        """Load the first of `names`; the others can be switched to later. Raises ModelLoadError
        when the first cannot be loaded: there is nothing to serve without it. quantize="int8"
        loads every model with int8 weights (see engine/quantize.py)."""
        self.names = tuple(dict.fromkeys(str(name) for name in names))
        if not self.names:
            raise ValueError("at least one model is needed")
        self.device = pick_device(device)
        self.quantize = quantize
        self._switching = threading.Lock()  # one load at a time; requests never wait for it
        self.loading: str | None = None  # the model being loaded to switch to, while it loads
        self._current = self._load(self.names[0])

    @property
    def current(self) -> LoadedModel:
        return self._current

    def settling(self) -> bool:
        """Whether the model line may still change by itself: while the decode kernels build."""
        return not kernels.settled()

    def switch(self, name: str) -> LoadedModel:
        """Load `name` and serve it from now on. When it fails, the current model stays."""
        if name not in self.names:
            raise ModelLoadError(f"{name!r} is not one of the models this app was started with "
                                 f"({', '.join(self.names)})")
        with self._switching:
            if name != self._current.name:
                self.loading = name
                try:
                    self._current = self._load(name)
                finally:
                    self.loading = None
        return self._current

    def _prepare(self, name: str) -> tuple[GPT2, Tokenizer]:
        """The model as it will serve: loaded, quantised if asked, with the engine's fast paths on
        (the kernels build in the background; until then it decodes on PyTorch)."""
        model, tokenizer = load_pretrained(None if name == BUNDLED else name, device=self.device)
        return prepare_for_serving(model, self.quantize), tokenizer

    def _load(self, name: str) -> LoadedModel:
        log.info("loading model %s on %s", name, self.device)
        try:  # in a thread that ends, so that the scheduler's thread decodes without a second OpenMP pool
            model, tokenizer = in_thread_of_its_own(lambda: self._prepare(name))
        except Exception as error:  # whatever goes wrong, the model being served must keep serving
            log.warning("could not load model %s: %s", name, error)
            reason = str(error).removeprefix(f"{name}: ")  # a checkpoint error starts with the path it names
            raise ModelLoadError(f"could not load {name}: {reason}") from error
        loaded = LoadedModel(name, model, tokenizer, Scheduler(model), self.quantize)
        log.info("model %s decodes on %s", name, loaded.decode_path)
        return loaded
