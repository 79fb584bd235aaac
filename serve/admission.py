"""One queue for every run of the model, first come first served: the page's, its Gradio API's
and OpenAI's /v1 alike.

A host (model_host.py, backend.py) takes each run through its RunQueue once the run's input is
checked: at most `concurrency` runs go at once, sharing the scheduler's batched decode step; up
to `queue_size` more wait for their turn in the order they came; one more is refused with
QUEUE_FULL, the same message on every path (the page's status line, the Gradio API's error, /v1's
429). A waiting run whose cancel event is set (the page's Stop) leaves the queue at once, withdrawn
(serve/outcome.py).

Gradio's own queue does not hold the runs (ui/tab.py, GENERATION_EVENT): when it held the page's
behind its workers while /v1 went straight to the scheduler, under load a page's run waited four
to six times as long for its first text as a /v1 one (docs/hardening.md, "Load").
"""
from __future__ import annotations

import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Generator, Iterator

from engine.scheduler import MAX_BATCH

from .messages import Message, Refusal

# Runs at once: as many as one decode step has rows, since they share it and cost little more
# than one; and how many more may wait.
DEFAULT_CONCURRENCY, DEFAULT_QUEUE_SIZE = MAX_BATCH, 64
QUEUE_FULL = "queue_full"  # the key of the refusal of a run that finds the queue full
# How often a waiting run that asks to (Ticket.wait) is told its place: what a page shows while
# it waits; and each one lets Gradio close the run of a page that has gone.
WAITING_UPDATE_S = 1.0
CANCEL_POLL_S = 0.25  # how soon a waiting run sees that its cancel event was set (each look wakes a thread)
# Threads a server keeps beside those of the runs in the queue (Starlette's and Gradio's default):
# each run waits for its turn in a thread of its own (RunQueue.threads).
OTHER_THREADS = 40


@dataclass(frozen=True)
class Waiting:
    """An update of a run that waits for its turn: its `place` in the queue (1: next); after those,
    place 0 when its turn has come."""
    place: int

    @property
    def message(self) -> Message:
        return Message.keyed("waiting", place=self.place)


class Ticket:
    """One run's place: waiting in its queue until `admitted` is set, held until it leaves."""

    def __init__(self, queue: RunQueue):
        self.queue = queue
        self.admitted = threading.Event()
        self.left = False

    def leave(self) -> None:
        """Give the place back (to the first run waiting); again, nothing. A run leaves as soon as
        its outcome is known, not once its caller has read it: a page's last update takes Gradio a
        round trip, and the place would stand idle meanwhile."""
        self.queue._leave(self)

    def wait(self, cancel: threading.Event | None = None, tell: bool = False) -> Generator[Waiting, None, bool]:
        """Wait for its turn, or for `cancel` to be set; with `tell`, yielding its place at once
        and every WAITING_UPDATE_S while it waits, and place 0 when its turn comes. Returns whether
        its turn came (False: `cancel` was set first)."""
        next_told, told = time.monotonic(), False
        while not self.admitted.is_set():
            if is_set(cancel):
                return False
            if tell and time.monotonic() >= next_told:
                place = self.queue.place_of(self)
                if place:  # (0: admitted meanwhile)
                    told = True
                    yield Waiting(place)
                next_told += WAITING_UPDATE_S
            # woken by its turn at once; by a cancel, or for its next place, at the next look
            self.admitted.wait(CANCEL_POLL_S if cancel is not None else WAITING_UPDATE_S if tell else None)
        if told:
            yield Waiting(0)
        return True


def is_set(cancel: threading.Event | None) -> bool:
    return cancel is not None and cancel.is_set()


class RunQueue:
    """At most `concurrency` runs at once, and `queue_size` more waiting in the order they came."""

    def __init__(self, concurrency: int = DEFAULT_CONCURRENCY, queue_size: int = DEFAULT_QUEUE_SIZE):
        self.concurrency, self.queue_size = concurrency, queue_size
        self._lock = threading.Lock()
        self._waiting: deque[Ticket] = deque()
        self.running = 0  # runs admitted and not yet gone

    @property
    def capacity(self) -> int:
        """Runs it holds at most, going and waiting."""
        return self.concurrency + self.queue_size

    @property
    def threads(self) -> int:
        """Threads a server needs to hand every run it holds one: a run waits for its turn in a
        thread, so with fewer, a request could wait for a thread outside the queue, past runs that
        came after it; and OTHER_THREADS for everything else."""
        return self.capacity + OTHER_THREADS

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @contextmanager
    def turn(self) -> Iterator[Ticket]:
        """A place for one run, held for the block: admitted at once where a run may go and
        none waits, otherwise last in the queue (Ticket.wait); a Refusal (QUEUE_FULL) where the
        queue is full. Leaving the block gives the place to the first run waiting."""
        ticket = self._enter()
        try:
            yield ticket
        finally:
            ticket.leave()

    def place_of(self, ticket: Ticket) -> int:
        """Its place in the queue, 1 the next to go; 0 once it is not waiting."""
        with self._lock:
            return self._waiting.index(ticket) + 1 if ticket in self._waiting else 0

    def _enter(self) -> Ticket:
        ticket = Ticket(self)
        with self._lock:
            if self.running + len(self._waiting) >= self.capacity:
                raise Refusal(QUEUE_FULL, capacity=self.capacity)
            self._waiting.append(ticket)
            self._admit()
        return ticket

    def _leave(self, ticket: Ticket) -> None:
        with self._lock:
            if ticket.left:
                return
            ticket.left = True
            if ticket.admitted.is_set():
                self.running -= 1
            else:
                self._waiting.remove(ticket)
            self._admit()

    def _admit(self) -> None:
        """The first waiting runs go, as many as may (the lock is held)."""
        while self._waiting and self.running < self.concurrency:
            self._waiting.popleft().admitted.set()
            self.running += 1
