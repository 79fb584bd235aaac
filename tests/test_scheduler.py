"""Batched decoding (engine/cache.py, engine/scheduler.py): rows of different lengths and
adapters in one step, and the continuous-batching scheduler: every request gets the tokens it
gets alone, Stop and failures end only their own requests, one decode thread serves them all.
How fast they are is measured by `python -m bench.decode`, not here."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import replace
from typing import Iterator

import pytest
import torch

from engine import generate as generate_module, kernels, scheduler as scheduler_module
from engine.cache import new_cache
from engine.generate import Chunk, Result, SamplingParams, decode_tokens, generate, stream
from engine.scheduler import Scheduler
from model import GPT2, load_pretrained
from model.adapters import active_adapter

from .conftest import REPO, copy_of, serving, wait_until



# --- per-row cache positions and adapters --------------------------------------------------------

@pytest.fixture(scope="module")
def loaded(adapter_checkpoint):
    return serving(load_pretrained(adapter_checkpoint))


def test_rows_of_different_lengths_decode_together(loaded):
    """Two prompts prefilled alone and joined in one cache, then decoded in one batch, give the
    logits of a full recompute of each row."""
    model, _ = loaded
    ids = torch.randint(0, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(1))
    lengths = (5, 9)
    cache = new_cache(model, 2, 16)
    for row, n in enumerate(lengths):
        prompt_cache = new_cache(model, 1, n)
        model(ids[row:row + 1, :n], cache=prompt_cache)
        cache.copy_row(row, prompt_cache)
    steps = []
    for i in range(5):
        next_ids = torch.stack([ids[row, n + i] for row, n in enumerate(lengths)])[:, None]
        steps.append(model(next_ids, cache=cache)[:, -1])
    for row, n in enumerate(lengths):
        full = model(ids[row:row + 1, :n + 5])[0, n:]
        assert (torch.stack([s[row] for s in steps]) - full).abs().max() < 1e-5


@torch.no_grad()
def test_each_row_runs_its_own_adapter(loaded):
    model, _ = loaded
    ids = torch.randint(0, model.config.vocab_size, (3, 10), generator=torch.Generator().manual_seed(2))
    names = ["summarize", None, "translate"]
    with active_adapter(names):
        batch = model(ids)
    for row, name in enumerate(names):
        with active_adapter(name):
            alone = model(ids[row:row + 1])
        assert (batch[row] - alone[0]).abs().max() < 1e-5
    assert not torch.allclose(batch[0], model(ids[:1])[0], atol=1e-3)  # the adapter did change row 0


@pytest.mark.slow  # the decode kernels, whose rows do not depend on their batch (built first)
@torch.inference_mode()
def test_a_decode_step_gives_each_row_its_adapters_bits_alone_or_beside_rows_with_the_same_adapter(loaded):
    """A decode step's rows, some sharing an adapter, get the very bits each gets alone: the
    scheduler's promise that a request's text does not depend on the crowd. (PyTorch's product of
    several rows by lora_A rounds differently from one row's: the update is one product per row.)"""
    model, _ = loaded
    names = ["summarize", None, "summarize", "summarize", "translate", "translate", None, "summarize"]
    ids = torch.randint(0, model.config.vocab_size, (len(names), 9), generator=torch.Generator().manual_seed(3))

    def prefilled(rows: list[int]):
        cache = new_cache(model, len(rows), 9)
        for i, row in enumerate(rows):
            alone = new_cache(model, 1, 8)
            with active_adapter(names[row]):
                model(ids[row:row + 1, :8], cache=alone)
            cache.copy_row(i, alone)
        return cache

    with active_adapter(names):
        crowd = model(ids[:, 8:], cache=prefilled(list(range(len(names)))))
    for row, name in enumerate(names):
        with active_adapter(name):
            assert torch.equal(crowd[row], model(ids[row:row + 1, 8:], cache=prefilled([row]))[0]), row


# --- the scheduler ------------------------------------------------------------------------------

# Eight requests that differ in everything a request can choose.
REQUESTS = [
    ("Once upon a time", SamplingParams(temperature=0, max_new_tokens=40), None),
    ("The cat sat", SamplingParams(temperature=0.8, top_k=40, seed=11, max_new_tokens=35), "summarize"),
    ("In the beginning", SamplingParams(temperature=1.2, top_p=0.9, seed=12, max_new_tokens=30), "translate"),
    ("Hello", SamplingParams(temperature=0, repetition_penalty=1.3, max_new_tokens=25), "summarize"),
    ("A long time ago in a land far away", SamplingParams(temperature=1.0, no_repeat_ngram_size=2, seed=13,
                                                          max_new_tokens=20), None),
    ("Yes", SamplingParams(temperature=0.7, top_k=5, top_p=0.8, repetition_penalty=1.1, seed=14,
                           max_new_tokens=33), "translate"),
    ("Question: why?", SamplingParams(temperature=0, no_repeat_ngram_size=3, max_new_tokens=12), None),
    ("1 2 3", SamplingParams(temperature=1.0, seed=15, max_new_tokens=28), "summarize"),
]


def tokens_alone(model, tokenizer, prompt: str | list[int], params, adapter) -> list[int]:
    ids = tokenizer.encode(prompt) if isinstance(prompt, str) else prompt
    return [int(t[0]) for t in decode_tokens(model, [ids], params, [params.seed or 0],
                                             adapter=adapter)]


@pytest.fixture(scope="module", params=["fp32", "int8"])
def loaded_any(request, adapter_checkpoint):
    return serving(load_pretrained(adapter_checkpoint), quantize="int8" if request.param == "int8" else None)


def test_requests_decoded_together_equal_each_alone(loaded_any):
    """Six requests queued before the scheduler starts run as one batch from the first step; two
    more join while it runs. Each gets exactly the tokens it gets alone, with int8 weights too."""
    model, tokenizer = loaded_any
    scheduler = Scheduler(model, max_batch=8)

    def submit(prompt, params, adapter):
        return scheduler.decode(tokenizer.encode(prompt), params, params.seed or 0, adapter=adapter)

    streams = [submit(*request) for request in REQUESTS[:6]]
    outputs = [[int(next(streams[0])[0])]]  # starts the scheduler: all six are admitted at once
    streams += [submit(*request) for request in REQUESTS[6:]]
    outputs[0] += [int(t[0]) for t in streams[0]]
    outputs += [[int(t[0]) for t in s] for s in streams[1:]]
    assert scheduler.largest_batch >= 6
    for (prompt, params, adapter), output in zip(REQUESTS, outputs):
        assert output == tokens_alone(model, tokenizer, prompt, params, adapter)
        assert len(output) == params.max_new_tokens


def run_in_threads(target, n: int) -> list:
    """target(i) in n threads started together; their results in order."""
    results, barrier = [None] * n, threading.Barrier(n)

    def run(i):
        barrier.wait()
        results[i] = target(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    return results


def test_concurrent_streams_equal_each_alone_with_stop_strings(loaded):
    """The app's path: eight threads stream through one scheduler, with stop strings and EOS."""
    model, tokenizer = loaded
    requests = []
    for i, (prompt, params, adapter) in enumerate(REQUESTS):
        if i % 2 == 0:  # a stop string from the middle of what the request writes without one
            text = generate(model, tokenizer, prompt, params, adapter=adapter).text
            params = replace(params, stop=(text[len(text) // 2:len(text) // 2 + 2],))
        requests.append((prompt, params, adapter))
    alone = [generate(model, tokenizer, prompt, params, adapter=adapter) for prompt, params, adapter in requests]
    scheduler = Scheduler(model)
    crowd = run_in_threads(lambda i: generate(scheduler, tokenizer, requests[i][0], requests[i][1],
                                              adapter=requests[i][2]), len(requests))
    assert scheduler.largest_batch > 1
    for a, c in zip(alone, crowd):
        assert (c.text, c.token_ids, c.stop_reason) == (a.text, a.token_ids, a.stop_reason)
    assert {a.stop_reason for a in alone} >= {"stop_string", "max_tokens"}  # both ways of ending were tried


def test_cancelling_one_request_leaves_the_others_unchanged(loaded):
    model, tokenizer = loaded
    requests = [(prompt, replace(params, max_new_tokens=60), adapter) for prompt, params, adapter in REQUESTS[:4]]
    alone = [generate(model, tokenizer, prompt, params, adapter=adapter) for prompt, params, adapter in requests]
    scheduler = Scheduler(model)
    cancel = threading.Event()

    def run(i):
        prompt, params, adapter = requests[i]
        events = []
        for event in stream(scheduler, tokenizer, prompt, params, cancel if i == 1 else None, adapter):
            events.append(event)
            if i == 1 and isinstance(event, Chunk):
                cancel.set()  # request 1 stops after its first piece of text
        return events[-1]

    results = run_in_threads(run, len(requests))
    assert all(isinstance(r, Result) for r in results)
    cancelled = results[1]
    assert cancelled.stop_reason == "cancelled" and 0 < cancelled.generated_tokens < 60
    assert cancelled.token_ids == alone[1].token_ids[:cancelled.generated_tokens]
    for i in (0, 2, 3):
        assert results[i].token_ids == alone[i].token_ids and len(results[i].token_ids) == 60


def test_the_batch_cache_grows_as_requests_join(loaded, monkeypatch):
    monkeypatch.setattr(scheduler_module, "CACHE_STEP", 16)
    model, tokenizer = loaded
    short = SamplingParams(temperature=0, max_new_tokens=20)  # 4 + 20 tokens: a cache of 32 slots
    long = SamplingParams(temperature=0.9, seed=5, max_new_tokens=70)  # 3 + 70: it grows (past half: to 128), row 0 filled
    scheduler = Scheduler(model)
    first = scheduler.decode(tokenizer.encode("Once upon a time"), short, 0)
    second = scheduler.decode(tokenizer.encode("The cat sat"), long, 5)
    assert [int(t[0]) for t in first] == tokens_alone(model, tokenizer, "Once upon a time", short, None)
    assert [int(t[0]) for t in second] == tokens_alone(model, tokenizer, "The cat sat", long, None)
    assert scheduler.largest_batch == 2


@contextmanager
def forward_calls(model: GPT2, release: threading.Event, on_call=lambda calls: None) -> Iterator[list[int]]:
    """The tokens per row of each forward call of `model`, in order, as they happen; every
    decode step (one token per row) first waits for `release`, so that the test can queue
    requests, or close the scheduler, while a step is held. on_call(calls) runs after each."""
    calls: list[int] = []

    def record(module, args):
        if args[0].shape[1] == 1:
            release.wait(10)
        calls.append(args[0].shape[1])
        on_call(calls)

    handle = model.register_forward_pre_hook(record)
    try:
        yield calls
    finally:
        handle.remove()


def test_a_long_prompt_goes_in_by_chunks_between_the_others_steps(loaded, monkeypatch):
    """A newcomer's long prompt is prefilled a chunk at a time with the running request's decode
    steps in between, not all at once while the running request waits; both get the tokens they
    get alone (where the prompt goes in by the same chunks), and a request cancelled halfway
    through its prompt never takes a row."""
    chunk = 4
    monkeypatch.setattr(generate_module, "PREFILL_CHUNK", chunk)
    model, tokenizer = loaded
    running_params, long_params = SamplingParams(temperature=0, max_new_tokens=40), SamplingParams(max_new_tokens=5, seed=3)
    running_prompt, long_prompt = tokenizer.encode("Once upon a time"), tokenizer.encode(" the cat sat on the mat" * 4)
    newcomer_chunks = -(-len(long_prompt) // chunk)
    assert len(running_prompt) <= chunk and newcomer_chunks > 4
    scheduler = Scheduler(model)
    queued = threading.Event()  # the running request's steps wait until both long prompts are queued

    def cancel_at_the_third_prompt(calls):
        if sum(tokens > 1 for tokens in calls) == 2 + newcomer_chunks:  # the third prompt's first chunk
            cancelled.close()

    with forward_calls(model, queued, cancel_at_the_third_prompt) as calls:
        running = scheduler.decode(running_prompt, running_params, 0)
        output = [int(next(running)[0])]  # from its prompt; its first step waits
        newcomer = scheduler.decode(long_prompt, long_params, 3)
        cancelled = scheduler.decode(long_prompt, long_params, 4)
        queued.set()
        newcomer_output = [int(t[0]) for t in newcomer]
        output += [int(t[0]) for t in running]
    prefills = [i for i, tokens in enumerate(calls) if tokens > 1]
    steps = [i for i, tokens in enumerate(calls) if tokens == 1]
    assert len(prefills) == 2 + newcomer_chunks  # the cancelled prompt went no further than its first chunk
    newcomer_calls = prefills[1:1 + newcomer_chunks]
    assert all(any(a < step < b for step in steps) for a, b in zip(newcomer_calls, newcomer_calls[1:]))
    assert newcomer_output == tokens_alone(model, tokenizer, long_prompt, long_params, None)
    assert output == tokens_alone(model, tokenizer, running_prompt, running_params, None)
    assert scheduler.largest_batch == 2 and scheduler.newcomer_prefilled is None


def test_a_request_done_at_its_first_token_still_leaves_a_step_between_two_prompts(loaded, monkeypatch):
    """A newcomer whose first token ends it leaves the batch before the next step, and that step
    still runs for the others: no more than PREFILL_CHUNK prompt tokens go in between two steps
    of the running request, even when the next newcomer's prompt follows at once."""
    chunk = 4
    monkeypatch.setattr(generate_module, "PREFILL_CHUNK", chunk)
    model, tokenizer = loaded
    running_params = SamplingParams(temperature=0, max_new_tokens=20)
    one_token, long_params = SamplingParams(temperature=0, max_new_tokens=1), SamplingParams(max_new_tokens=3, seed=3)
    running_prompt, short_prompt = tokenizer.encode("Once upon a time"), tokenizer.encode("The cat")
    long_prompt = tokenizer.encode(" the cat sat on the mat" * 2)
    assert len(running_prompt) <= chunk and len(short_prompt) <= chunk < len(long_prompt)
    scheduler = Scheduler(model)
    queued = threading.Event()  # the running request's first step waits until both newcomers are queued
    with forward_calls(model, queued) as calls:
        running = scheduler.decode(running_prompt, running_params, 0)
        output = [int(next(running)[0])]
        short = scheduler.decode(short_prompt, one_token, 0)
        long = scheduler.decode(long_prompt, long_params, 3)
        queued.set()
        short_output, long_output = [int(t[0]) for t in short], [int(t[0]) for t in long]
        output += [int(t[0]) for t in running]
    stretches, fed = [], 0  # prompt tokens fed between two steps of the running request
    for tokens in calls[1:]:
        if tokens == 1:
            stretches.append(fed)
            fed = 0
        else:
            fed += tokens
    assert max(stretches) <= chunk, calls
    assert short_output == tokens_alone(model, tokenizer, short_prompt, one_token, None)
    assert long_output == tokens_alone(model, tokenizer, long_prompt, long_params, None)
    assert output == tokens_alone(model, tokenizer, running_prompt, running_params, None)


def test_closing_the_scheduler_ends_its_requests_and_its_turns_on_the_decode_thread(loaded, monkeypatch):
    """close() returns once the decode thread has ended the requests and let go of the batch's
    cache (at interpreter exit a tensor freed later aborts the process): here the decode thread
    is slowed right after it ends the requests, which is where an early return would show."""
    model, tokenizer = loaded
    scheduler = Scheduler(model)
    params = SamplingParams(temperature=0, max_new_tokens=50)
    gate = threading.Event()
    end_all = Scheduler._end_all

    def slow_end_all(self, error):
        end_all(self, error)
        time.sleep(0.3)

    monkeypatch.setattr(Scheduler, "_end_all", slow_end_all)
    with forward_calls(model, gate):
        tokens = scheduler.decode(tokenizer.encode("Once upon"), params, 0)
        next(tokens)  # the token from the prompt; the first decode step is now held
        assert not scheduler.idle and scheduler in scheduler_module.DECODER.serving
        closer = threading.Thread(target=scheduler.close)
        closer.start()
        assert wait_until(lambda: scheduler.closed)
        gate.set()
        closer.join(10)
    assert not closer.is_alive() and scheduler.idle and scheduler.rows_in_use == 0
    assert wait_until(lambda: scheduler not in scheduler_module.DECODER.serving)  # its turn has ended
    with pytest.raises(RuntimeError, match="decoding failed .RuntimeError: the scheduler was closed"):
        list(tokens)
    with pytest.raises(RuntimeError, match="the scheduler was closed"):
        scheduler.decode(tokenizer.encode("The cat"), params, 0)


def test_a_held_decode_step_shows_as_a_stall_while_requests_wait_and_none_when_idle(loaded):
    """stalled_s, what a replica reports its health by (serve/cluster.py): how long the decode
    thread's turn has taken while a request waits; it grows while a step is held, and is 0 once
    the loop goes on and when nothing waits, however long the scheduler was idle before."""
    model, tokenizer = loaded
    scheduler = Scheduler(model)
    time.sleep(0.3)  # idle: nothing waits, so no stall, however long
    assert scheduler.stalled_s() == 0
    gate = threading.Event()
    with forward_calls(model, gate):
        tokens = scheduler.decode(tokenizer.encode("Once upon"), SamplingParams(temperature=0, max_new_tokens=5), 0)
        next(tokens)  # the token from the prompt; the first decode step is now held
        assert wait_until(lambda: scheduler.stalled_s() > 0.3)
        gate.set()
        assert len(list(tokens)) == 4
    assert wait_until(lambda: scheduler.idle) and scheduler.stalled_s() == 0


def test_one_decode_thread_serves_every_scheduler_in_turn_and_stays_for_the_next_request(loaded):
    """Two schedulers (two models) with requests at once are decoded by the same thread, taking
    turns, each request getting its tokens alone; the thread outlives them, holding no cache, and
    decodes the next request too."""
    model, tokenizer = loaded
    twin = kernels.install(copy_of(model))
    schedulers = [Scheduler(model), Scheduler(twin)]
    params = [SamplingParams(temperature=0.8, top_k=40, seed=5, max_new_tokens=20),
              SamplingParams(temperature=0, max_new_tokens=25)]
    threads_by_model = {id(model): set(), id(twin): set()}
    def record(module, args):
        threads_by_model[id(module)].add(threading.current_thread())

    handles = [m.register_forward_pre_hook(record) for m in (model, twin)]
    try:
        outputs = run_in_threads(lambda i: [int(t[0]) for t in schedulers[i].decode(
            tokenizer.encode("Once upon a time"), params[i], 5)], 2)
        thread = scheduler_module.DECODER.thread
        assert threads_by_model[id(model)] == threads_by_model[id(twin)] == {thread}
        # A reader has its last token a turn before its scheduler retires the row and leaves.
        assert wait_until(lambda: all(s.idle for s in schedulers))
        assert thread.is_alive()
        later = [int(t[0]) for t in schedulers[0].decode(tokenizer.encode("The cat"), params[1], 0)]
    finally:
        for handle in handles:
            handle.remove()
    assert scheduler_module.DECODER.thread is thread and threads_by_model[id(model)] == {thread}
    for m, p, output in zip((model, twin), params, outputs):
        assert output == tokens_alone(m, tokenizer, "Once upon a time", p, None)
    assert later == tokens_alone(model, tokenizer, "The cat", params[1], None)


def test_closing_a_scheduler_never_served_ends_its_queued_requests(loaded):
    model, tokenizer = loaded
    scheduler = Scheduler(model)
    queued = scheduler.decode(tokenizer.encode("Once upon"), SamplingParams(temperature=0, max_new_tokens=5), 0)
    scheduler.close()  # before anyone waited for a token: the decode thread was never asked to serve it
    with pytest.raises(RuntimeError, match="decoding failed .RuntimeError: the scheduler was closed"):
        next(queued)
    assert scheduler.closed and scheduler.idle and scheduler not in scheduler_module.DECODER.serving


@pytest.mark.slow  # the app's model host, in a process of its own
def test_the_app_loads_its_model_in_a_thread_that_ends_so_only_the_decode_thread_keeps_openmp_workers():
    """libgomp keeps worker threads for every thread that has run parallel work until it ends, and
    with more of them than cores its workers sleep between regions (scheduler.in_thread_of_its_own
    says why that slows decoding). So loading the bundled model (its copies are parallel work) must
    leave no thread behind; requests from other threads start the one decode thread, which keeps
    its one OpenMP worker (two threads with OMP_NUM_THREADS=2) and nothing else, through more
    requests and other parallel work in passing threads. Counted in a fresh interpreter, after
    importing torch (which starts one thread of its own)."""
    code = """
import os, threading, torch
from engine.generate import SamplingParams, generate
from engine.scheduler import in_thread_of_its_own
from tests.conftest import wait_until
from serve.model_host import ModelHost

def threads_settle_at(expected):  # an ended thread may linger a moment in /proc
    return wait_until(lambda: len(os.listdir("/proc/self/task")) == expected, timeout_s=5)

from engine import kernels
kernels.wait_until_built()  # the build's thread has ended
import time
def held_count(hold_s=0.5):  # a native thread the imports started may end just after: count once it is still
    count, since = len(os.listdir("/proc/self/task")), time.monotonic()
    deadline = since + 10
    while time.monotonic() - since < hold_s and time.monotonic() < deadline:
        time.sleep(0.05)
        if len(os.listdir("/proc/self/task")) != count:
            count, since = len(os.listdir("/proc/self/task")), time.monotonic()
    return count
before = held_count()
host = ModelHost(["bundled"], device="cpu")
assert threads_settle_at(before), "loading left a thread behind"
current = host.current

def three_requests():
    requests = [threading.Thread(target=generate, args=(current.scheduler, current.tokenizer, "Once upon a time",
                                                        SamplingParams(max_new_tokens=8, seed=seed)))
                for seed in range(3)]
    for request in requests:
        request.start()
    for request in requests:
        request.join()

three_requests()
assert current.scheduler.largest_batch > 1
assert threads_settle_at(before + 2), "the requests left other threads than the decode thread and its worker"
assert in_thread_of_its_own(lambda: torch.ones(10**6).sum().item()) == 10**6
three_requests()
assert threads_settle_at(before + 2)
try:
    in_thread_of_its_own(lambda: 1 / 0)
except ZeroDivisionError:
    pass
else:
    raise AssertionError("the work's exception was not raised")
"""
    env = {**os.environ, "OMP_NUM_THREADS": "2"}  # one OpenMP thread would keep no worker, and prove nothing
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def test_a_reader_beside_others_reads_the_tokens_of_several_steps_per_wake_up(loaded, monkeypatch):
    """With other requests decoding beside its own, a reader that finds no token waiting pauses
    (READ_PAUSE_S) before it waits, then reads every token that came meanwhile without waiting
    again. The pause is replaced here by one that lasts until three tokens are waiting (or the
    request is done), so nothing depends on the machine's speed. A request decoding alone never
    pauses."""
    model, tokenizer = loaded
    scheduler = Scheduler(model)
    reading: list[list[int]] = []  # the prompt of the request being read
    pauses: list[int] = []  # how many of its tokens had been read at each pause
    read: list[int] = []

    def pause(request):
        prompt = reading[-1]
        assert request.history[0, :len(prompt)].tolist() == prompt  # the reader's own request, not the other
        pauses.append(len(read))
        assert wait_until(lambda: request.out.qsize() >= 3 or request.done, timeout_s=30)

    def tokens(prompt: str, params) -> list[int]:
        reading.append(tokenizer.encode(prompt))
        read.clear()
        read.extend(int(t[0]) for t in scheduler.decode(reading[-1], params, 0))
        return list(read)

    monkeypatch.setattr(scheduler_module, "pause_reading", pause)
    params = SamplingParams(temperature=0, max_new_tokens=30)
    alone = tokens("The cat", params)
    assert len(alone) == 30 and pauses == []
    beside = scheduler.decode(tokenizer.encode("Once upon a time"), replace(params, max_new_tokens=60), 1)
    assert tokens("The cat", params) == alone
    assert len(list(beside)) == 60
    assert 0 < len(pauses) <= 10, pauses
    runs = [b - a for a, b in zip(pauses, pauses[1:] + [len(read)])]  # tokens read after each pause
    assert all(run >= 3 for run in runs[:-1]), (pauses, runs)


def test_a_paused_reader_hears_at_once_that_its_request_is_done(loaded, monkeypatch):
    """A reader's pause beside other requests ends when its request is done (its last token and
    DONE queued), not READ_PAUSE_S later: with the pause an hour long, a short request read beside
    a long one still ends, with the tokens it gets alone."""
    model, tokenizer = loaded
    monkeypatch.setattr(scheduler_module, "READ_PAUSE_S", 3600)
    scheduler = Scheduler(model)
    params = SamplingParams(temperature=0, max_new_tokens=6)
    long = scheduler.decode(tokenizer.encode("Once upon a time"), replace(params, max_new_tokens=200), 1)
    next(long)  # the long request holds a row, so the short one's reader pauses
    outcome: list = []
    reader = threading.Thread(target=lambda: outcome.extend(
        int(t[0]) for t in scheduler.decode(tokenizer.encode("The cat"), params, 0)), daemon=True)
    reader.start()
    reader.join(60)
    long.close()
    assert not reader.is_alive(), "the reader slept through the end of its request"
    assert outcome == tokens_alone(model, tokenizer, "The cat", params, None)


def test_a_request_closed_before_its_first_token_never_decodes(loaded):
    model, tokenizer = loaded
    scheduler = Scheduler(model)
    params = SamplingParams(temperature=0, max_new_tokens=8)
    left = scheduler.decode(tokenizer.encode("Once upon"), params, 0)
    left.close()  # its caller went away before reading anything
    kept = [int(t[0]) for t in scheduler.decode(tokenizer.encode("The cat"), params, 0)]
    assert kept == tokens_alone(model, tokenizer, "The cat", params, None)
    assert scheduler.largest_batch == 1  # the closed request never took a row
    assert next(left, None) is None


@pytest.mark.parametrize("part_prefilled", [False, True])
def test_a_failed_decode_step_fails_its_rows_and_the_queue_goes_on(loaded, monkeypatch, part_prefilled):
    """A decode step that raises (say, out of memory) ends the requests in that step with an
    error; a request still waiting, or with its prompt part prefilled, is then decoded, on a
    fresh cache, exactly as alone."""
    monkeypatch.setattr(generate_module, "PREFILL_CHUNK", 4)
    model, tokenizer = loaded
    # One row: the second request waits. Two rows: its long prompt goes in between the first's steps.
    scheduler = Scheduler(model, max_batch=2 if part_prefilled else 1)
    params = SamplingParams(max_new_tokens=6, temperature=0)
    second = tokenizer.encode(" the cat sat on the mat" * 2 if part_prefilled else "The cat")
    steps, failed_with = [], []

    def fail_a_decode_step(module, args):
        if args[0].shape[1] == 1:  # one new token per row: a decode step, not a prefill
            steps.append(True)
            if len(steps) == (2 if part_prefilled else 1):  # two rows: after the second prompt's first chunk
                failed_with.append(scheduler.newcomer_prefilled)
                raise MemoryError("no memory for this step")

    handle = model.register_forward_pre_hook(fail_a_decode_step)
    try:
        first = scheduler.decode(tokenizer.encode("Once upon"), params, 0)
        waiting = scheduler.decode(second, params, 0)
        tokens = []  # its caller waits for them from the start, as the app's do
        reader = threading.Thread(target=lambda: tokens.extend(int(t[0]) for t in waiting), daemon=True)
        reader.start()
        with pytest.raises(RuntimeError, match="decoding failed .MemoryError: no memory for this step"):
            list(first)
        reader.join(30)
    finally:
        handle.remove()
    assert failed_with == ([4] if part_prefilled else [None])
    assert tokens == tokens_alone(model, tokenizer, second, params, None)
    assert wait_until(lambda: scheduler.rows_in_use == 0)
