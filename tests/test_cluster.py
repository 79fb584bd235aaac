"""Past one machine (serve/cluster.py, serve/backend.py): two replicas of the service layer behind
the deployment's ingress under Ray Serve, on a local Ray instance with 2 CPUs started here, each
answering with the text a single process gives for the same seed; the app in front of them
(--backend) serving every tab; the faults a client can see: a replica killed mid-stream (every
stream ends saying how), one killed while requests wait (they are answered elsewhere with their
seed's text), a wedged one (Ray replaces it), scaling down (running streams finish); and a backend
that is down. One Ray instance serves every test here: each starts from two live replicas (ready)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx
import pytest
from gradio_client import Client

from serve.apis import APIS
from serve.backend import CONNECT_TIMEOUT_S, BackendDown, RemoteHost
from serve.cluster import APP, DEPLOYMENT, model_replicas
from serve.model_host import ModelHost

from .conftest import REPO, open_app, refused, studio_app, values_for, wait_until

pytestmark = pytest.mark.slow  # a Ray instance and its replicas


STALL_S = 6  # the deployment's bound on a wedged decode loop here (30 s by default)
REPLACED_S = 180  # generous: a replica's process started and its model loaded, on a busy machine


def config(model: str, **studio):
    """The deployment as a Serve config gives it (`serve deploy`, KubeRay): serve.cluster:build with
    its args, two replicas of `model` behind the ingress; `studio` overrides options of the model's
    deployment, which Ray changes without restarting the replicas it keeps (num_replicas)."""
    from ray.serve.schema import ServeDeploySchema

    from serve.cluster import runtime_env

    app = {"name": APP, "route_prefix": "/", "import_path": "serve.cluster:build", "runtime_env": runtime_env(),
           "args": {"model": model, "replicas": 2, "cpus_per_replica": 1, "stall_s": STALL_S, "test_hooks": "1"},
           "deployments": [{"name": DEPLOYMENT, **studio}] if studio else []}
    return ServeDeploySchema.model_validate({"applications": [app]})


def deploy(model: str, wait: bool = True, **studio) -> None:
    """Apply config(model, **studio), as `serve deploy` does (through Ray's own client: Ray has no
    public call for it in Python); `wait`: until the model's replicas are as many as it says."""
    from ray.serve.context import _get_global_client

    _get_global_client().deploy_apps(config(model, **studio))
    deployed.clear()
    deployed.update(studio)
    replicas = studio.get("num_replicas", 2)
    assert not wait or wait_until(lambda: len(model_replicas()) == replicas and states().get("RUNNING") == replicas,
                                  timeout_s=REPLACED_S)


deployed: dict = {}  # the options config() overrides now


def states() -> dict[str, int]:
    """How many of the model's replicas are in each of Ray's states (RUNNING, STOPPING, ...)."""
    from ray import serve

    app = serve.status().applications.get(APP)
    return {} if app is None or DEPLOYMENT not in app.deployments else app.deployments[DEPLOYMENT].replica_states


@pytest.fixture(scope="module")
def cluster(app_models):
    """Two replicas of the small model with adapters, behind the ingress and Ray Serve's HTTP
    proxy: its URL."""
    import ray
    from ray import serve

    from bench.load import free_port

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    deploy(app_models[0])
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.fixture
def ready(cluster, app_models) -> str:
    """The cluster with two live replicas that answer (a test before may have killed or removed one)."""
    if deployed:  # a test scaled it (Ray itself restarts a replica killed)
        deploy(app_models[0])
    assert wait_until(lambda: len(model_replicas()) == 2 and states() == {"RUNNING": 2}, timeout_s=REPLACED_S)
    assert wait_until(lambda: answers(cluster), timeout_s=REPLACED_S)
    time.sleep(1)  # (the ingress hears of a replica that has just started)
    return cluster


def answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/studio/model", timeout=10).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture(scope="module")
def local(app_models) -> ModelHost:
    """The same model in this process: what a single process answers."""
    return ModelHost([app_models[0]], device="cpu")


def last_update(updates) -> tuple:
    *_, last = updates
    return last


def remote_run(url: str, api_name: str, values: dict) -> tuple[str, str, dict]:
    """(the replica that answered, the run's text, its outcome) through /studio/run."""
    with httpx.stream("POST", f"{url}/studio/run/{api_name}", json=values, timeout=120) as response:
        lines = [json.loads(line) for line in response.iter_lines()]
        return response.headers["x-replica"], lines[-1]["text"], lines[-1]["outcome"]


REQUESTS = [("generate", dict(prompt="Once upon a time", max_new_tokens=16, seed=1)),
            ("generate", dict(prompt="The old king said", temperature=0, max_new_tokens=16)),
            ("chat", dict(message="How are you?", history=[["Hello", "Hi!"]], seed=14, adapter=True)),
            ("translate", dict(text="The cat is sleeping.", target="German", adapter=True, seed=3)),
            ("summarize", dict(article="A fox saw grapes. He could not reach them. He said they were sour.",
                               seed=4, adapter=True))]


def test_two_replicas_answer_clients_each_with_the_single_process_text(ready, local):
    expected = {i: last_update(local.run(APIS[name], values_for(name, **given)))[0]
                for i, (name, given) in enumerate(REQUESTS)}
    def answer(i: int) -> tuple[int, tuple]:
        name, given = REQUESTS[i]
        return i, remote_run(ready, name, values_for(name, **given))

    with ThreadPoolExecutor(8) as clients:
        answers = list(clients.map(answer, [i % len(REQUESTS) for i in range(20)]))
    assert len({replica for _, (replica, _, _) in answers}) == 2  # both replicas served
    for i, (replica, text, outcome) in answers:
        assert outcome["kind"] == "done" and text == expected[i], (replica, REQUESTS[i])
    # OpenAI's API on each replica too, named by X-Replica
    completions = [httpx.post(f"{ready}/v1/completions", json={"model": local.current.name, "prompt": "Hello",
                                                                 "max_tokens": 8, "seed": 5}, timeout=120)
                   for _ in range(4)]
    assert all(c.status_code == 200 and c.headers["x-replica"] for c in completions)
    assert len({c.json()["choices"][0]["text"] for c in completions}) == 1


def test_the_app_in_front_serves_every_tab_with_logprobs_compare_and_look_inside(ready, local):
    backend = RemoteHost(ready)
    assert backend.current.adapters == local.current.adapters and backend.current.config == local.current.config
    with studio_app(backend) as (_, url):
        client = Client(url, verbose=False)
        for name, given in REQUESTS:
            text, status, prompt, logprobs = client.predict(**given, logprobs=3, api_name=f"/{name}")
            alone = last_update(local.run(APIS[name], values_for(name, **given, logprobs=3)))
            assert (text, prompt) == (alone[0], alone[2]) and status.startswith("seed ")
            assert [entry["token"] for entry in logprobs] == [entry["token"] for entry in alone[3]]
        refused = pytest.raises(Exception, client.predict, prompt="   ", api_name="/generate")
        assert "prompt is empty" in str(refused.value)
    summarize = {**values_for("summarize", **REQUESTS[4][1]), "compare": "adapter"}
    texts, outcome, comparison = last_update(backend.run_compare(APIS["summarize"], summarize))
    expected = last_update(local.run_compare(APIS["summarize"], summarize))
    assert texts == expected[0] and comparison.diverges_at == expected[2].diverges_at and outcome.ran
    # what differs named as the request names it, the rest the task's defaults, as /compare takes it
    setting = {**REQUESTS[4][1], "max_new_tokens": 8, "seed": 3, "compare": "setting:top_k=0"}
    texts, outcome, comparison = last_update(backend.run_compare(APIS["summarize"], setting))
    assert texts == last_update(local.run_compare(APIS["summarize"], setting))[0] and comparison.axis == setting["compare"]
    view, alone = backend.look_inside("Once upon a time", 2, 1, "translate"), local.look_inside("Once upon a time", 2, 1, "translate")
    # the same tokens; their probabilities the same up to rounding (a replica sums on its own threads)
    assert [t for t, _ in view.seen.top_tokens] == [t for t, _ in alone.seen.top_tokens]
    assert [p for _, p in view.seen.top_tokens] == pytest.approx([p for _, p in alone.seen.top_tokens], rel=1e-4)
    assert view.lens.top_tokens == alone.lens.top_tokens


@pytest.mark.browser
def test_the_page_in_front_runs_a_tab_and_looks_inside(ready, browser):
    from playwright.sync_api import expect

    with studio_app(RemoteHost(ready)) as (_, url):
        page = open_app(browser, url)
        expect(page.locator("#model-info")).to_contain_text(f"served by {ready}")
        page.locator("#generate-prompt textarea").fill("Once upon a time")
        page.locator("#generate-run").click()
        expect(page.locator("#generate-status")).to_contain_text(re.compile(r"seed \d+ · \d+ prompt"))
        page.get_by_role("tab", name="Architecture").click()
        page.locator("#architecture-run").click()
        expect(page.locator("#architecture-top")).to_contain_text("%")
        page.context.close()


@dataclass
class Stream:
    """One client's stream, as it was read: the replica that answered it (X-Replica) and how often
    it was sent again (X-Retries), its text, and how it ended: "done" (its finish_reason, then
    [DONE]; or, on /studio, its outcome), "error" (an error event, or a fault's outcome, saying the
    replica stopped) or "cut" (neither: what a client cannot tell from a whole answer)."""
    kind: str  # "sse" (raw server-sent events), "openai" (the openai client), "studio" (/studio's JSON lines)
    seed: int
    started: threading.Event = field(default_factory=threading.Event)
    replica: str | None = None
    retries: int | None = None
    text: str = ""
    ending: str = ""
    error: dict | None = None
    ended_at: float = 0.0


LONG = dict(prompt="Once upon a time", max_tokens=512, temperature=1.0)


def read_sse(url: str, model: str, stream: Stream, **request) -> Stream:
    """A /v1/completions stream read as raw server-sent events."""
    body = {"model": model, **LONG, **request, "seed": stream.seed, "stream": True}
    events = []
    try:
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=300) as response:
            stream.replica, stream.retries = response.headers.get("x-replica"), int(response.headers["x-retries"])
            for line in response.iter_lines():
                if line.startswith("data: "):
                    events.append(line.removeprefix("data: "))
                    if events[-1] != "[DONE]" and "choices" in json.loads(events[-1]):
                        stream.text += json.loads(events[-1])["choices"][0]["text"]
                    stream.started.set()
    finally:
        stream.ended_at = time.monotonic()
    last = json.loads(events[-1]) if events and events[-1] != "[DONE]" else None
    if events[-2:-1] and events[-1] == "[DONE]" and json.loads(events[-2])["choices"][0]["finish_reason"]:
        stream.ending = "done"
    elif last is not None and "error" in last:
        stream.ending, stream.error = "error", last["error"]
    else:
        stream.ending = "cut"
    return stream


def read_openai(url: str, model: str, stream: Stream, **request) -> Stream:
    """A /v1/completions stream read with the `openai` client, as an application would."""
    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)
    raw = client.completions.with_raw_response.create(model=model, **{**LONG, **request}, seed=stream.seed,
                                                      stream=True)
    stream.replica, stream.retries = raw.headers.get("x-replica"), int(raw.headers["x-retries"])
    finish = None
    try:
        for chunk in raw.parse():
            stream.text += chunk.choices[0].text
            finish = chunk.choices[0].finish_reason
            stream.started.set()
        stream.ending = "done" if finish else "cut"
    except openai.APIError as error:  # the error event: the client raises it, with its body
        stream.ending, stream.error = "error", error.body
    finally:
        stream.ended_at = time.monotonic()
    return stream


def read_studio(url: str, model: str, stream: Stream, **values) -> Stream:
    """A /studio run read as its JSON lines (what `app.py --backend` reads)."""
    body = values_for("generate", **{"prompt": "Once upon a time", "max_new_tokens": 512, "top_k": 0,
                                     "no_repeat_ngram_size": 0, **values}, seed=stream.seed)
    lines = []
    try:
        with httpx.stream("POST", f"{url}/studio/run/generate", json=body, timeout=300) as response:
            stream.replica, stream.retries = response.headers.get("x-replica"), int(response.headers["x-retries"])
            for line in response.iter_lines():
                lines.append(json.loads(line))
                stream.started.set()
    finally:
        stream.ended_at = time.monotonic()
    outcome = lines[-1]["outcome"] if lines else None
    stream.text = lines[-1]["text"] if lines else ""
    if outcome is None:
        stream.ending = "cut"
    elif outcome["kind"] == "done":
        stream.ending = "done"
    else:
        stream.ending, stream.error = "error", outcome["message"]
    return stream


def read_page(url: str, model: str, stream: Stream, **values) -> Stream:
    """A run as the page in front reads it (`app.py --backend`: RemoteHost), which cannot tell
    which replica answers."""
    backend = RemoteHost(url)
    values = values_for("generate", **{"prompt": "Once upon a time", "max_new_tokens": 512, "top_k": 0,
                                       "no_repeat_ngram_size": 0, **values}, seed=stream.seed)
    for stream.text, outcome, _, _ in backend.run(APIS["generate"], values):
        stream.started.set()
    stream.ended_at = time.monotonic()
    stream.ending, stream.error = ("done", None) if outcome.ran else ("error", {"key": outcome.message.key})
    return stream


READERS = {"sse": read_sse, "openai": read_openai, "studio": read_studio, "page": read_page}


def said_the_replica_stopped(stream: Stream) -> bool:
    """The error a stream ended with is the ingress's: its replica stopped in the middle."""
    if stream.kind in ("studio", "page"):  # (the page's own cut would say "backend_cut")
        return stream.error["key"] == "replica_lost"
    return stream.error["code"] == "replica_stopped" and stream.error["type"] == "server_error" \
        and "stopped in the middle" in stream.error["message"]


def kill(replica: str) -> None:
    import ray

    ray.kill(ray.get_actor(model_replicas()[replica], namespace="serve"))  # its process ends at once


def test_a_replica_killed_mid_stream_ends_each_of_its_streams_with_an_error_and_the_others_finish(ready, app_models):
    """Streams read four ways (raw events, the openai client, /studio's lines, the page in front) on
    both replicas; one replica is killed once all have text. None ends as if whole: each of the
    killed replica's still running ends with the error that says so, each of the other's with its
    finish_reason and [DONE] (its outcome); Ray starts a new replica, and the deployment answers
    again."""
    streams = [Stream(kind, seed) for seed, kind in enumerate(["sse", "openai", "studio"] * 3 + ["page"] * 2)]
    with ThreadPoolExecutor(len(streams)) as clients:
        reads = [clients.submit(READERS[s.kind], ready, app_models[0], s) for s in streams]
        assert all(s.started.wait(120) for s in streams), [r.exception(0) for r in reads if r.done()]
        serving = Counter(s.replica for s in streams if s.replica)
        victim = serving.most_common(1)[0][0]
        running = {id(s) for s in streams if s.replica == victim and not s.ended_at}
        kill(victim)
        for read in reads:
            read.result(timeout=300)
    assert not [s for s in streams if s.ending == "cut"], "streams cut as if whole"
    assert running, "the killed replica had no stream running"
    for s in streams:
        if id(s) in running:
            assert s.ending == "error" and said_the_replica_stopped(s), s
        elif s.kind == "page":  # on either replica
            assert s.ending == "done" or said_the_replica_stopped(s), s
        elif s.replica != victim:
            assert s.ending == "done" and s.text, s
    assert wait_until(lambda: len(model_replicas()) == 2 and victim not in model_replicas(), timeout_s=REPLACED_S)
    assert wait_until(lambda: answers(ready), timeout_s=REPLACED_S)



def wedge() -> str:
    """A replica's decode loop wedged for good (the deployment's test hook, reached only through a
    handle): the replica's id."""
    from ray import serve

    handle = serve.get_deployment_handle(DEPLOYMENT, app_name=APP)
    # in a thread of its own: the browser's test leaves an event loop in this one, where Ray refuses to block
    with ThreadPoolExecutor(1) as thread:
        return thread.submit(lambda: handle.wedge.remote().result(timeout_s=60)).result()


def ask(url: str, model: str, kind: str, seed: int) -> Stream:
    """A short seeded request of `kind` ("completion": /v1 not streamed; "sse"; "studio") read to
    its end."""
    if kind == "sse":
        return read_sse(url, model, Stream(kind, seed), max_tokens=12)
    if kind == "studio":
        return read_studio(url, model, Stream(kind, seed), max_new_tokens=12)
    try:
        response = httpx.post(f"{url}/v1/completions", json={"model": model, **LONG, "max_tokens": 12, "seed": seed},
                              timeout=300)
    finally:
        ended_at = time.monotonic()
    done = response.status_code == 200
    return Stream(kind, seed, replica=response.headers.get("x-replica"), retries=int(response.headers["x-retries"]),
                  text=response.json()["choices"][0]["text"] if done else "", ending="done" if done else "error",
                  error=None if done else response.json()["error"], ended_at=ended_at)


KINDS = ("completion", "sse", "studio")


def test_requests_waiting_on_a_replica_that_is_killed_are_answered_by_another_with_their_seeds_text(
        ready, app_models):
    """A wedged replica holds the requests sent to it before any text; killed, its requests go to
    the other replica, with their seed: each client gets its seed's text (as the seed gives it
    alone), streamed or not, the retry said only by X-Retries."""
    model = app_models[0]
    seeds = range(100, 100 + 3 * len(KINDS))
    alone = {(kind, seed): ask(ready, model, kind, seed).text for seed, kind in zip(seeds, KINDS * 3)}
    wedged = wedge()
    with ThreadPoolExecutor(len(alone)) as clients:
        # Ray routes each to either replica. The other's answers come in a moment; what still waits
        # then waits on the wedged replica (if none does, the next ones go there: the other is busier).
        asked, waiting = {}, set()
        keys = list(alone)
        for batch in (keys[:3], keys[3:6], keys[6:]):  # each has every kind
            asked.update({key: clients.submit(ask, ready, model, *key) for key in batch})
            answered = -1
            while answered != (answered := sum(f.done() for f in asked.values())):
                time.sleep(2)
            waiting = {key for key, f in asked.items() if not f.done()}
            if waiting:
                break
        assert waiting and wedged in model_replicas(), "nothing waited on the wedged replica"
        kill(wedged)
        answers = {key: f.result(timeout=REPLACED_S) for key, f in asked.items()}
    for key, answer in answers.items():
        assert answer.ending == "done" and answer.text == alone[key], (key, answer)
        assert answer.replica != wedged
        assert (answer.retries >= 1) == (key in waiting), (key, answer)



def test_a_wedged_replica_fails_its_health_check_and_is_replaced_while_the_other_serves(ready, app_models):
    """A replica whose decode loop stops (the test hook) fails its health check once the loop has
    made no progress for STALL_S while requests wait: Ray replaces it. Meanwhile the other replica
    answers what is sent, and what was sent to the wedged one is answered elsewhere, with its seed's
    text, once the wedged replica has gone."""
    model = app_models[0]
    alone = {seed: ask(ready, model, "completion", seed).text for seed in range(200, 206)}
    wedged = wedge()
    with ThreadPoolExecutor(64) as clients:
        held = {seed: clients.submit(ask, ready, model, "completion", seed) for seed in alone}
        meanwhile = []  # a request every half second while the replica is wedged
        deadline = time.monotonic() + REPLACED_S
        while wedged in model_replicas() and time.monotonic() < deadline:
            meanwhile.append(clients.submit(ask, ready, model, "sse", 300 + len(meanwhile) % 50))
            time.sleep(0.5)
        gone = time.monotonic()
        assert wedged not in model_replicas(), f"the wedged replica is still there after {REPLACED_S} s"
        answers = {seed: f.result(timeout=REPLACED_S) for seed, f in held.items()}
        meanwhile = [f.result(timeout=REPLACED_S) for f in meanwhile]
    for seed, answer in answers.items():
        assert answer.ending == "done" and answer.text == alone[seed], (seed, answer)
    assert any(answer.retries for answer in answers.values()), "no request waited on the wedged replica"
    assert all(answer.ending == "done" and answer.replica != wedged for answer in meanwhile)
    assert any(answer.ended_at < gone and not answer.retries for answer in meanwhile), "the other replica served none"
    assert wait_until(lambda: len(model_replicas()) == 2, timeout_s=REPLACED_S)  # its replacement


def test_scaling_down_lets_the_streams_of_the_replica_removed_finish_and_sends_it_nothing_new(ready, app_models):
    """Scaled from two replicas to one while streams run on both (Ray's own path for a replica that
    autoscaling removes): the replica removed takes no new requests, and each of its streams goes
    on to its finish_reason and [DONE] before the replica goes (within the drain's bound)."""
    from serve.cluster import DRAIN_S

    model = app_models[0]
    streams: list[Stream] = []
    with ThreadPoolExecutor(9) as clients:
        reads = []
        for wave in range(3):  # until both replicas stream: each wave sees the other's load
            new = [Stream(kind, 500 + len(streams) + i) for i, kind in enumerate(["sse", "openai", "sse"])]
            # long streams: 8 choices, streamed one after another
            reads += [clients.submit(READERS[s.kind], ready, model, s, n=8) for s in new]
            streams += new
            assert all(s.started.wait(120) for s in new)
            if len({s.replica for s in streams}) == 2:
                break
        assert len({s.replica for s in streams}) == 2, "Ray sent every stream to one replica"
        deploy(model, wait=False, num_replicas=1)
        assert wait_until(lambda: states().get("STOPPING") == 1, timeout_s=60)
        draining = time.monotonic()
        time.sleep(1)  # (the ingress hears of it)
        newcomers = [ask(ready, model, "completion", 600 + i) for i in range(4)]
        for read in reads:
            read.result(timeout=DRAIN_S + 60)
    assert wait_until(lambda: len(model_replicas()) == 1, timeout_s=DRAIN_S + 60)
    removed = {s.replica for s in streams} - set(model_replicas())
    assert len(removed) == 1
    assert all(s.ending == "done" for s in streams), [s for s in streams if s.ending != "done"]
    assert any(s.ended_at > draining for s in streams if s.replica in removed), \
        "the removed replica's streams had all ended before it was removed"
    assert all(answer.ending == "done" and answer.replica not in removed for answer in newcomers), newcomers


def test_a_backend_that_is_down_is_said_within_seconds_and_stop_reaches_the_replica(app_models):
    from bench.load import free_port
    from serve.backend import STOPPED_NOTE

    start = time.monotonic()
    with refused("backend_down") as down:
        RemoteHost(f"http://127.0.0.1:{free_port()}")  # nothing listens there
    assert time.monotonic() - start < 5 and isinstance(down.value, BackendDown)
    port = free_port()  # one replica without Ray, which wants a key
    replica = subprocess.Popen([sys.executable, "-m", "serve.replica", "--model", app_models[0], "--device", "cpu",
                                "--port", str(port), "--api-key", "sesame"], cwd=REPO)
    try:
        url = f"http://127.0.0.1:{port}"
        assert wait_until(lambda: listening(url), timeout_s=120)
        with refused("backend_failed", status=401):
            RemoteHost(url)
        backend = RemoteHost(url, api_key="sesame")
        # Stop ends a remote run at once, with the seed and settings that reproduce it
        cancel, updates = threading.Event(), []
        for update in backend.run(APIS["generate"], values_for("generate", prompt="Once upon a time",
                                                               max_new_tokens=512, seed=21), cancel):
            updates.append(update)
            if len(updates) == 1:
                stop_pressed = time.monotonic()
                cancel.set()
        ended = updates[-1][1]
        assert time.monotonic() - stop_pressed < 2
        assert ended.stop_reason == "cancelled" and ended.seed == 21 and ended.notes[0] == STOPPED_NOTE
        # a backend that goes away while the page is up: the next run says so in its status line
        replica.terminate()
        replica.wait(30)
        with studio_app(backend) as (_, app_url):
            start = time.monotonic()
            error = pytest.raises(Exception, Client(app_url, verbose=False).predict, prompt="Hello",
                                  api_name="/generate")
            assert f"the backend {url} does not answer" in str(error.value)
            assert time.monotonic() - start < 5 + CONNECT_TIMEOUT_S
    finally:
        replica.kill()


def listening(url: str) -> bool:
    try:
        return httpx.get(f"{url}/studio/model", timeout=2).status_code in (200, 401)
    except httpx.HTTPError:
        return False


def test_the_flags_set_the_replicas_their_cpus_the_autoscaling_bounds_the_health_check_and_the_drain():
    from ray import serve

    from serve.cluster import HEALTH_CHECK_PERIOD_S, ModelReplica, build, parse_args, replica_options

    args = parse_args(["--replicas", "3", "--cpus-per-replica", "0.5", "--min-replicas", "1", "--max-replicas", "4",
                       "--port", "9000", "--address", "auto", "--stall-s", "20", "--drain-s", "90",
                       "--scale-down-s", "60"])
    assert (args.replicas, args.cpus_per_replica, args.min_replicas, args.max_replicas, args.port, args.address,
            args.stall_s, args.drain_s, args.scale_down_s) == (3, 0.5, 1, 4, 9000, "auto", 20, 90, 60)
    assert parse_args([]).port == 8000  # Ray Serve's own
    fixed = replica_options(3, 0.5, drain_s=90)
    assert fixed["num_replicas"] == 3 and fixed["ray_actor_options"]["num_cpus"] == 0.5
    assert "autoscaling_config" not in fixed
    assert fixed["graceful_shutdown_timeout_s"] == 90 and fixed["health_check_period_s"] == HEALTH_CHECK_PERIOD_S
    scaled = replica_options(2, 1, min_replicas=1, max_replicas=4, stall_s=6, scale_down_s=60)
    assert "num_replicas" not in scaled
    assert scaled["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 4, "initial_replicas": 2,
                                            "target_ongoing_requests": 8, "downscale_delay_s": 60}
    assert scaled["health_check_period_s"] == 2  # a shorter bound on a stall is checked more often
    for options in (fixed, scaled):  # Ray takes them
        serve.deployment(ModelReplica).options(**options)
    assert build({"model": "bundled", "replicas": "1", "cpus_per_replica": "1", "stall_s": "10"}) is not None
