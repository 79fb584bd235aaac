"""Continuous batching: one thread decodes every running request in one batch.

That thread (DECODER) decodes for every scheduler of the process, a turn each, and stays
between requests.

Requests arrive from many threads (the app's workers) at any time, each with its own prompt,
sampling settings, seed, adapter and steering. Between two decode steps the scheduler retires the
requests that are done or cancelled and admits waiting ones (each prompt is prefilled apart
from the running rows, then copied into a free row of the batch's KV cache); each step then
runs every active row through the model at once. A long prompt is prefilled a chunk at a time
(PREFILL_CHUNK tokens), with the running rows' steps in between, so a newcomer stalls the
others' streams for one chunk at a time, not for its whole prompt. One step reads the weights
once for all its rows, so eight requests cost far less than eight times one.

A request samples with its own `Sampler` (its settings and its own random generator), so a
seeded request gives the same tokens alone or in a crowd (on a CPU with the decode kernels of
engine/kernels.py bit for bit; on PyTorch's products up to their order of additions, which may
differ with the number of rows). A prefill or a sampling that
fails ends its own request; a decode step that fails ends the requests in it, and the waiting
ones go on. Callers use the scheduler through
`engine.generate.stream(scheduler, ...)`, which turns its tokens into text, stop strings and a
`Result` exactly as for a model run alone.
"""
from __future__ import annotations

import atexit
import queue
import threading
import time
import weakref
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, TypeVar

import torch

from model.adapters import active_adapter, as_choice, check_adapter
from model.config import GPT2Config
from model.gpt2 import GPT2

from . import generate as generation
from .cache import KVCache, new_cache
from .generate import Sampler, SamplingParams, check_prompt_fits, new_token_budget, pick_tokens, prefill_chunk
from .steering import Steering, as_steering, check_steering, steered

T = TypeVar("T")
DONE = None  # what a request's queue receives after its last token
CACHE_STEP = 128  # the batch's cache grows in steps of this many slots
MAX_BATCH = 8  # rows of one decode step
# While other requests decode beside its own, a reader that finds none of its tokens waiting
# sleeps this long before it waits for the next one, so the tokens of the next few steps wake it
# once rather than once each: a wake-up costs the reading thread tens of microseconds of CPU, taken
# from the cores and the GIL that decode. The app shows
# text at most 12 times a second (serve/running.py), so no one sees it. A pause ends early when the
# request is done (Request.finished), so its last tokens and its end are never a pause late.
READ_PAUSE_S = 0.01


@dataclass(eq=False)
class Request:
    sampler: Sampler
    adapter: tuple[str, float] | None  # (name, scale), as model.adapters.active_adapter takes it
    steering: Steering | None  # as engine.steering.steered takes it
    tokens: torch.Tensor  # (1, prompt + budget): the prompt, then each token as it is sampled
    length: int  # tokens filled so far
    budget: int  # the length at which it is done (the context or max_new_tokens is full)
    out: queue.SimpleQueue  # its sampled tokens, then DONE (or the exception that stopped it)
    cancelled: bool = False  # set by its caller's thread; the scheduler retires it before the next step
    failed: bool = False  # its own prefill or sampling raised; the scheduler retires it, the others go on
    finished: threading.Event = field(default_factory=threading.Event)  # set with DONE or its error

    @property
    def done(self) -> bool:
        return self.cancelled or self.failed or self.length == self.budget

    def fail(self, error: Exception) -> None:
        self.failed = True
        self.end_with(error)

    def end_with(self, last: Exception | None) -> None:
        """Queue what ends its stream (DONE or the error that stopped it); a pausing reader wakes."""
        self.out.put(last)
        self.finished.set()

    @property
    def history(self) -> torch.Tensor:
        return self.tokens[:, :self.length]

    def take(self, token: torch.Tensor | Exception) -> None:
        """Record its sampled token, or the error its own sampling raised: it alone stops."""
        if isinstance(token, Exception):
            self.fail(token)
            return
        self.tokens[0, self.length] = token
        self.length += 1
        self.out.put(token)
        if self.length == self.budget:
            self.end_with(DONE)  # now, not when the row is retired: its reader need not wait a step


@dataclass(eq=False)
class Prefill:
    """A newcomer whose prompt is going in, a chunk at a time, into a cache of its own."""
    request: Request
    prefilled: int = 0  # prompt tokens in `cache` so far
    cache: KVCache | None = None


class Scheduler:
    """Runs the requests of many threads on one model, in one batch of at most `max_batch` rows."""

    def __init__(self, model: GPT2, max_batch: int = MAX_BATCH):
        self.model = model
        self.max_batch = max_batch
        self.largest_batch = 0  # the most rows one decode step has run: shows that requests shared steps
        self.rows_in_use = 0  # requests decoding now: shows that a finished or cancelled one let go of its row
        self._lock = threading.Lock()  # guards _waiting and _served
        self._waiting: deque[Request] = deque()
        # Whether the decode thread (DECODER) serves it now; _left is set whenever it does not and
        # holds nothing of it (close() waits for that).
        self._served = False
        self._left = threading.Event()
        self._left.set()
        # When the decode thread last began a turn on it, or began to serve it: how a wedged loop
        # shows (stalled_s).
        self._progressed = time.monotonic()
        # The decode thread's, while it serves it: the running requests (row i of the batch is
        # _active[i]), the batch's KV cache, and the newcomers whose prompts are going in (read by
        # close() when it is not served).
        self._active: list[Request] = []
        self._cache: KVCache | None = None
        self._prefill: Prefill | None = None
        self._closed = False
        OPEN.add(self)

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop decoding: the running and waiting requests end with an error at the next step,
        new ones are refused, and the decode thread's turn at it is waited for (at most timeout_s).

        Called for every scheduler at interpreter exit: a decode thread still inside a matrix
        kernel while the interpreter tears itself down aborts the process.
        """
        with self._lock:
            self._closed = True
            served = self._served
        if not served:  # the decode thread will not fail the queued requests: fail them here
            self._end_all(RuntimeError("the scheduler was closed"))
        elif threading.current_thread() is not DECODER.thread:
            self._left.wait(timeout_s)

    @property
    def config(self) -> GPT2Config:
        return self.model.config

    @property
    def closed(self) -> bool:
        """Whether close() was called: new requests are refused, queued and running ones end."""
        return self._closed

    @property
    def idle(self) -> bool:
        """Whether the decode thread has left it holding nothing of it, no rows and no batch cache:
        before anyone reads a request, between requests, and once close() has returned."""
        return self._left.is_set() and self._cache is None and not self._active

    def stalled_s(self) -> float:
        """How long requests have waited on the decode thread's current turn at this scheduler (or
        for its first): a turn (an admission, a prefill chunk, a decode step) takes milliseconds to
        seconds, so a long wait is a wedged loop; 0 while nothing waits (it is not served). A
        replica reports its health by it (serve/cluster.py)."""
        with self._lock:
            served = self._served
        return time.monotonic() - self._progressed if served else 0.0

    @property
    def newcomer_prefilled(self) -> int | None:
        """How many tokens of the prompt now going in (a chunk at a time) are in; None when none is."""
        prefill = self._prefill  # read once: the decode thread may drop it meanwhile
        return None if prefill is None else prefill.prefilled

    def decode(self, prompt: list[int], params: SamplingParams, seed: int,
               adapter: str | None = None, trace: list | None = None, eos_id: int | None = None,
               steering: Steering | None = None, drawn_before: int = 0) -> "RequestTokens":
        """Queue one request now; its tokens (one (1,)-shaped tensor per step) arrive through the
        returned iterator, as `decode_tokens` yields them for a batch of one (`drawn_before` too).
        Closing the iterator retires the request before the next step (also before its first
        token); the other requests go on as they were."""
        check_adapter(self.model, adapter)
        check_steering(self.model, steering)
        check_prompt_fits(self.model, len(prompt))
        device = self.model.device
        budget = len(prompt) + new_token_budget(params.max_new_tokens, len(prompt), self.config.n_positions)
        tokens = torch.empty(1, budget, dtype=torch.long, device=device)
        tokens[0, :len(prompt)] = torch.tensor(prompt)
        sampler = Sampler(params, seed, device, trace, eos_id, prompt_length=len(prompt) - drawn_before)
        request = Request(sampler, as_choice(adapter, params.adapter_scale), as_steering(steering), tokens,
                          len(prompt), budget, queue.SimpleQueue())
        with self._lock:
            if self._closed:
                raise RuntimeError("the scheduler was closed")
            self._waiting.append(request)
        return RequestTokens(self, request)

    def _serve(self) -> None:
        """Have the decode thread serve this scheduler, unless it does already."""
        with self._lock:
            if self._served or self._closed:
                return
            self._served = True
            self._progressed = time.monotonic()
            self._left.clear()
        try:
            DECODER.serve(self)
        except BaseException:  # no thread could start: not served, as before
            with self._lock:
                self._leave()
            self._let_go()
            raise

    def _leave(self) -> None:
        """It is no longer served (the lock is held). Where the decode thread was serving it, that
        thread lets go of it next (_let_go)."""
        self._served = False

    def _let_go(self) -> None:
        """The decode thread drops its requests and cache; unless it serves it again already, it
        has left. Only then does close() return: a tensor freed while the interpreter shuts down
        aborts the process."""
        self._active, self._cache = [], None
        with self._lock:
            if not self._served:
                self._left.set()

    def _tick(self) -> bool:
        """One turn on the decode thread: retire finished rows and admit waiting ones, then one
        decode step for every active row. False once nothing is left to run: it has left the
        thread, and holds no cache."""
        self._progressed = time.monotonic()
        try:
            with torch.inference_mode():
                if self._cache is None:
                    # The batch's cache lives while requests run: an idle app holds none. It starts
                    # empty and grows to what the admitted requests can reach.
                    self._cache = new_cache(self.model, self.max_batch, max_len=0)
                if self._admit():
                    self._step()
                    return True
        except Exception as error:  # a failed step: its rows hear of it; the queue goes on, on a fresh cache
            self._fail(self._active, error)
            with self._lock:
                if self._waiting or self._prefill is not None:
                    self._active, self._cache = [], None
                    return True
                self._leave()
        self._let_go()
        return False

    def _fail(self, requests: list[Request], error: BaseException) -> None:
        self.rows_in_use = 0
        for request in requests:
            request.fail(error)

    def _end_all(self, error: BaseException) -> None:
        """Fail the active requests and every waiting one; it leaves the decode thread, if there."""
        with self._lock:
            stranded = list(self._waiting)
            self._leave()
            self._waiting.clear()
        prefill, self._prefill = self._prefill, None
        if prefill is not None:
            stranded.append(prefill.request)
        self._fail(self._active + stranded, error)

    def _admit(self) -> bool:
        """Retire finished rows and fill free ones from the queue; False (and it leaves the decode
        thread) when nothing is left to run or the scheduler was closed.

        Newcomers' prompts go in chunk by chunk, at most PREFILL_CHUNK tokens before each step
        (several short prompts, or one chunk of a long one), so that the running rows are never
        stalled for long.
        """
        active, cache = self._active, self._cache  # row i of the batch is active[i]
        self._retire_done()
        fed = 0  # prompt tokens prefilled before this step
        while len(active) < self.max_batch and not self._closed:
            if self._prefill is None:
                with self._lock:
                    if not self._waiting:
                        if not active:
                            self._leave()
                            self.rows_in_use = 0
                            return False
                        break
                    self._prefill = Prefill(self._waiting.popleft())
            prefill = self._prefill
            request = prefill.request
            if request.cancelled:  # its caller left while it waited or between its chunks
                self._prefill = None
                continue
            chunk = min(generation.PREFILL_CHUNK, request.length - prefill.prefilled)
            if fed and fed + chunk > generation.PREFILL_CHUNK:
                break  # after the step
            try:
                if prefill.cache is None:
                    prefill.cache = new_cache(self.model, 1, request.length)
                with active_adapter(request.adapter), steered(self.model, request.steering):
                    prefill.prefilled, logits = prefill_chunk(self.model, request.history, prefill.cache,
                                                              prefill.prefilled)
                fed += chunk
                if prefill.prefilled < request.length:
                    continue
                cache.grow(cache_length(request.budget))
                cache.copy_row(len(active), prefill.cache)
            except Exception as error:  # e.g. out of memory for this prompt: the batch goes on without it
                self._prefill = None
                request.fail(error)
                continue
            self._prefill = None  # it is in the batch's cache now
            active.append(request)
            request.take(pick_tokens([request.sampler], logits, [request.history])[0])
        if self._closed:  # checked before each prefill too, so that close() waits for one at most
            self._end_all(RuntimeError("the scheduler was closed"))
            return False
        self.rows_in_use = len(active)
        return True

    def _retire_done(self) -> None:
        """Drop the rows that are done; the last row moves into each one's place, so the active
        rows stay the first ones."""
        active, cache = self._active, self._cache
        for row in reversed(range(len(active))):
            if active[row].done:  # its reader has had DONE, an error, or has gone (cancelled)
                last = len(active) - 1
                if row != last:
                    cache.copy_row(row, cache, last)
                    active[row] = active[last]
                active.pop()
        self.rows_in_use = len(active)

    def _step(self) -> None:
        """One decode step for every active row.

        Rows done since _admit (a newcomer's first token finished it, a caller left) leave first,
        and the others still step: skipping the step would let the next newcomer's prompt go in
        right after this one's, stalling the running rows longer than one chunk."""
        self._retire_done()
        active, cache = self._active, self._cache
        if not active or self._closed:
            return  # only a newcomer's prompt going in, or closing
        self.largest_batch = max(self.largest_batch, len(active))
        last_tokens = torch.cat([request.tokens[:, request.length - 1] for request in active])[:, None]
        with active_adapter([request.adapter for request in active]), \
                steered(self.model, [request.steering for request in active]):
            logits = self.model(last_tokens, cache=cache)[:, -1]
        picked = pick_tokens([request.sampler for request in active], logits, [request.history for request in active])
        for request, token in zip(active, picked):
            request.take(token)


class Decoder:
    """The one thread that decodes for every scheduler of the process, a turn each
    (Scheduler._tick), and waits for the next request when none has work.

    Before, each scheduler started a thread with its requests and ended it with them. PyTorch's
    OpenMP keeps worker threads for each thread that runs parallel work (see in_thread_of_its_own),
    so that fresh thread's first parallel calls started a pool of their own, which doubled a lone
    request's first token; this one thread lives as long as the process. And two
    schedulers (two models, as the benchmark alternates, or an app switching models while a
    request runs) share one pool rather than each slowing the other's."""

    def __init__(self):
        self._changed = threading.Condition()
        self._schedulers: list[Scheduler] = []  # those with work, in turn
        self.thread: threading.Thread | None = None

    def serve(self, scheduler: Scheduler) -> None:
        with self._changed:
            if self.thread is None:
                thread = threading.Thread(target=self._run, name="decoder", daemon=True)
                thread.start()  # if it cannot start, the scheduler hears of it and is not listed
                self.thread = thread
            self._schedulers.append(scheduler)
            self._changed.notify()

    @property
    def serving(self) -> tuple[Scheduler, ...]:
        """The schedulers it gives turns to now: those with work."""
        with self._changed:
            return tuple(self._schedulers)

    def _run(self) -> None:
        while True:
            # The turn's list lives in _take_turns only: one kept while this thread waits for work
            # would keep the last schedulers, and their models' weights, after the app let them go.
            self._take_turns(self._next_turn())

    def _next_turn(self) -> list[Scheduler]:
        """The schedulers with work, once there are any."""
        with self._changed:
            while not self._schedulers:
                self._changed.wait()
            return list(self._schedulers)

    def _take_turns(self, turn: list[Scheduler]) -> None:
        for scheduler in turn:
            try:
                more = scheduler._tick()
            except BaseException as error:  # the interpreter is stopping: every caller hears of it
                with self._changed:
                    stranded, self._schedulers, self.thread = self._schedulers, [], None
                for each in stranded:
                    each._end_all(error)
                    each._let_go()
                raise
            if not more:
                with self._changed:
                    self._schedulers.remove(scheduler)


DECODER = Decoder()
OPEN: "weakref.WeakSet[Scheduler]" = weakref.WeakSet()  # every scheduler not yet collected


@atexit.register
def close_all() -> None:
    for scheduler in list(OPEN):
        try:
            scheduler.close()
        except Exception:  # the others still close
            pass


def in_thread_of_its_own(work: Callable[[], T]) -> T:
    """work() run in a new thread that has ended when this returns; its result, or its exception.

    For PyTorch's parallel work that a server does once, such as loading a model. libgomp
    (PyTorch's OpenMP) keeps worker threads for every thread that has run parallel work, until
    that thread ends, and once it manages more threads than there are cores its workers sleep
    between parallel regions rather than spin, so each region then waits for a wake-up. The
    decode thread (DECODER) beside a main thread that loaded the model is that case: a crowd's
    step took half as long again as with the loading done in a thread that had ended.
    """
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="passing") as pool:
        future = pool.submit(work)
    return future.result()  # the pool's thread has ended: leaving `with` waited for it


def pause_reading(request: Request) -> None:
    """A reader's pause beside other requests: READ_PAUSE_S, or until its request is done if that
    comes sooner, so that a request's end is never a pause late."""
    request.finished.wait(READ_PAUSE_S)


def cache_length(budget: int) -> int:
    """The cache length that holds a request of `budget` tokens, rounded up to CACHE_STEP so that
    the cache grows (and copies itself) a few times, not with each request."""
    return -(-budget // CACHE_STEP) * CACHE_STEP


class RequestTokens:
    """The tokens of one queued request, as an iterator; close() cancels the request.

    Not a generator: closing a generator that has not started runs none of its code, and the
    request would decode on with no one reading it.
    """

    def __init__(self, scheduler: Scheduler, request: Request):
        self._scheduler, self._request = scheduler, request
        self._started = self._ended = False

    def __iter__(self) -> "RequestTokens":
        return self

    def __next__(self) -> torch.Tensor:
        if self._ended:
            raise StopIteration
        if not self._started:
            # Decoding starts when a caller first waits for a token, so requests queued together
            # (by one caller, or by several within a step) start decoding together.
            self._started = True
            self._scheduler._serve()
        elif self._request.out.empty() and self._scheduler.rows_in_use > 1:  # a lone request's never pause
            pause_reading(self._request)
        token = self._request.out.get()
        if token is DONE or isinstance(token, BaseException):
            self.close()
        if isinstance(token, BaseException):
            raise RuntimeError(f"decoding failed ({type(token).__name__}: {token})") from token
        if token is DONE:
            raise StopIteration
        return token

    def close(self) -> None:
        self._ended = True
        self._request.cancelled = True  # a no-op once it is done
