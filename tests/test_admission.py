"""The one queue every run of the model takes its turn in (serve/admission.py): first come first
served, at most `concurrency` at once, `queue_size` more waiting, one more refused; a waiting run
tells its place and leaves at once when stopped. The queue itself, then as the hosts run it: the
model's here (ModelHost) and a page's in front of a replica (RemoteHost). The page and /v1 in one
queue, served: tests/test_hardening.py."""
from __future__ import annotations

import socket
import threading
from contextlib import ExitStack, closing, contextmanager
from typing import Iterator

import pytest

from serve.admission import QUEUE_FULL, RunQueue, Waiting
from serve.apis import GENERATE_API, SUMMARIZE_API
from serve.backend import RemoteHost
from serve.model_host import ModelHost
from serve.outcome import REFUSED, Outcome, english_status

from .conftest import refused, wait_until


def test_runs_go_in_the_order_they_came_as_places_free():
    queue = RunQueue(concurrency=2, queue_size=3)
    with ExitStack() as places:
        tickets = [places.enter_context(queue.turn()) for _ in range(5)]
        assert [t.admitted.is_set() for t in tickets] == [True, True, False, False, False]
        assert [queue.place_of(t) for t in tickets] == [0, 0, 1, 2, 3]
        with refused(QUEUE_FULL, capacity=5):  # going and waiting: the queue holds no more
            places.enter_context(queue.turn())
    assert (queue.running, queue.waiting) == (0, 0)  # every place given back


def test_a_place_given_back_goes_to_the_first_waiting_not_to_a_newcomer():
    queue = RunQueue(concurrency=1, queue_size=2)
    first = queue.turn()
    first.__enter__()
    second, third = queue.turn(), queue.turn()
    waiting = [second.__enter__(), third.__enter__()]
    first.__exit__(None, None, None)
    assert waiting[0].admitted.is_set() and not waiting[1].admitted.is_set()
    with queue.turn() as newcomer:  # came after the third: waits behind it
        assert queue.place_of(newcomer) == 2 and queue.place_of(waiting[1]) == 1
        second.__exit__(None, None, None)
        assert waiting[1].admitted.is_set() and not newcomer.admitted.is_set()
        third.__exit__(None, None, None)
        assert newcomer.admitted.is_set()


def test_a_place_is_given_back_once_however_often_it_is_left():
    queue = RunQueue(concurrency=1, queue_size=1)
    with queue.turn() as first:
        with queue.turn() as second:
            first.leave()
            first.leave()
            assert second.admitted.is_set() and (queue.running, queue.waiting) == (1, 0)
    assert (queue.running, queue.waiting) == (0, 0)


def test_a_waiting_run_that_leaves_frees_its_place_in_the_queue():
    queue = RunQueue(concurrency=1, queue_size=1)
    with queue.turn():
        with queue.turn() as waiting:
            assert not waiting.admitted.is_set()
            with refused(QUEUE_FULL):
                queue.turn().__enter__()
        with queue.turn() as again:  # the place it left
            assert queue.place_of(again) == 1
    assert (queue.running, queue.waiting) == (0, 0)


def test_a_waiting_run_tells_its_place_then_that_its_turn_came():
    queue = RunQueue(concurrency=1, queue_size=2)
    holder = queue.turn()
    holder.__enter__()
    with queue.turn() as ticket:
        told = ticket.wait(tell=True)
        assert next(told) == Waiting(1)
        holder.__exit__(None, None, None)  # its turn
        assert list(told) == [Waiting(0)]
    assert list(RunQueue(1, 0).turn().__enter__().wait(tell=True)) == []  # admitted at once: nothing to tell


def test_a_cancel_takes_a_waiting_run_out_before_its_turn():
    queue = RunQueue(concurrency=1, queue_size=1)
    cancel = threading.Event()
    outcome = []
    with queue.turn():
        def waiting():
            with queue.turn() as ticket:
                outcome.append((yield from ticket.wait(cancel)))

        thread = threading.Thread(target=lambda: list(waiting()))
        thread.start()
        assert wait_until(lambda: queue.waiting == 1)
        cancel.set()
        thread.join()
    assert outcome == [False] and (queue.running, queue.waiting) == (0, 0)


# --- as the hosts run it ------------------------------------------------------------------------

def values(api=GENERATE_API, **given) -> dict:
    """A request to `api` as the Gradio API sends it: every parameter's default, and `given`."""
    return {**{name: p.default for name, p in api.signature.parameters.items()}, **given}


def compared(**given) -> dict:
    """A summary's request with the adapter off and on (run_compare's values)."""
    return values(SUMMARIZE_API, article="A fox.", compare="adapter", **given)


@pytest.fixture(scope="module")
def model_host(adapter_checkpoint) -> ModelHost:
    """One place, one waiting; a summarize adapter to compare with."""
    return ModelHost([str(adapter_checkpoint)], device="cpu", concurrency=1, queue_size=1)


@contextmanager
def place_taken(host) -> Iterator[None]:
    """The host's one place held by a run that is not read to its end."""
    with closing(host.run(GENERATE_API, values(prompt="Hold on", max_new_tokens=4, seed=1))) as holding:
        next(holding)
        yield


def test_a_hosts_waiting_run_tells_its_place_and_goes_when_its_turn_comes(model_host):
    with place_taken(model_host):
        run = model_host.run(GENERATE_API, values(prompt="Once upon a time", max_new_tokens=4, seed=3), waiting=True)
        assert next(run) == Waiting(1)
    rest = list(run)  # the place given back: its turn
    assert rest[0] == Waiting(0)
    *_, (text, outcome, _, _) = rest
    assert outcome.ran and outcome.seed == 3 and outcome.generated_tokens == 4
    assert (model_host.queue.running, model_host.queue.waiting) == (0, 0)


@pytest.mark.parametrize("compare", [False, True])
def test_a_run_gives_its_place_back_once_its_outcome_is_known_not_once_it_is_read(model_host, compare):
    if compare:
        run = model_host.run_compare(SUMMARIZE_API, compared(max_new_tokens=3))
    else:
        run = model_host.run(GENERATE_API, values(prompt="Hello", max_new_tokens=3))
    with closing(run):
        last = next(update for update in run if update[1] is not None)  # its last update, not yet read past
        assert last[1].ran and model_host.queue.running == 0


@pytest.mark.parametrize("compare", [False, True])
def test_stop_withdraws_a_waiting_run_and_says_so(model_host, compare):
    cancel = threading.Event()
    with place_taken(model_host):
        if compare:
            run = model_host.run_compare(SUMMARIZE_API, compared(seed=5), cancel, waiting=True)
        else:
            run = model_host.run(GENERATE_API, values(prompt="Hello", seed=5), cancel, waiting=True)
        assert next(run) == Waiting(1)
        cancel.set()
        outcome = next(run)[1]
        assert outcome == Outcome.withdrawn() and not outcome.ran
        assert english_status(outcome) == "stopped while it waited for its turn: nothing was generated"
        assert list(run) == [] and model_host.queue.waiting == 0


def test_a_run_that_finds_the_hosts_queue_full_is_refused_as_any_other_way_in(model_host):
    with place_taken(model_host):
        waiting = model_host.run(GENERATE_API, values(prompt="Hello"), waiting=True)
        assert next(waiting) == Waiting(1)  # the queue's one waiting place
        *_, (_, outcome, _, _) = model_host.run(GENERATE_API, values(prompt="Hello"))
        *_, (_, compare_outcome, _) = model_host.run_compare(SUMMARIZE_API, compared())
        for refusal in (outcome, compare_outcome):
            assert refusal.kind == REFUSED and refusal.message.key == QUEUE_FULL
            assert refusal.message.field("capacity") == 2
        waiting.close()
    assert (model_host.queue.running, model_host.queue.waiting) == (0, 0)


@pytest.fixture(scope="module")
def remote_host(tiny_checkpoint) -> Iterator[RemoteHost]:
    """A page's host in front of one replica served here (serve/replica.py, without Ray), the page's
    queue one place and one waiting."""
    import uvicorn

    from serve.replica import replica_app

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = replica_app(ModelHost([str(tiny_checkpoint)], device="cpu"), "replica")
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    assert wait_until(lambda: server.started, timeout_s=60)
    try:
        yield RemoteHost(f"http://127.0.0.1:{port}", concurrency=1, queue_size=1)
    finally:
        server.should_exit = True
        thread.join(30)


def test_a_page_in_front_of_replicas_queues_its_runs_as_the_app_does(remote_host):
    cancel = threading.Event()
    with place_taken(remote_host):
        run = remote_host.run(GENERATE_API, values(prompt="Hello", seed=7), cancel, waiting=True)
        assert next(run) == Waiting(1)
        *_, (_, full, _, _) = remote_host.run(GENERATE_API, values(prompt="Hello"))
        assert full.kind == REFUSED and full.message.key == QUEUE_FULL
        cancel.set()
        _, outcome, _, _ = next(run)
        assert outcome == Outcome.withdrawn() and list(run) == []
    *_, (text, done, _, _) = remote_host.run(GENERATE_API, values(prompt="Hello", max_new_tokens=3, seed=7))
    assert done.ran and done.generated_tokens == 3  # the place given back
