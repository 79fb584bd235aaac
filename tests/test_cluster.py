"""Past one machine (serve/cluster.py, serve/backend.py): two replicas of the service layer under
Ray Serve, on a local Ray instance with 2 CPUs started here, each answering with the text a single
process gives for the same seed; the app in front of them (--backend) serving every tab; a replica
killed mid-stream; and a backend that is down."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from gradio_client import Client

from serve.apis import APIS
from serve.backend import CONNECT_TIMEOUT_S, BackendDown, RemoteHost
from serve.model_host import ModelHost

from .conftest import REPO, open_app, refused, studio_app, wait_until

pytestmark = pytest.mark.slow  # a Ray instance and its replicas


@pytest.fixture(scope="module")
def cluster(app_models):
    """Two replicas of the small model with adapters, behind Ray Serve's HTTP proxy: its URL."""
    import ray
    from ray import serve

    from bench.load import free_port
    from serve.cluster import deployment

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(deployment([app_models[0]], replicas=2, cpus_per_replica=1), name="studio", route_prefix="/")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="module")
def local(app_models) -> ModelHost:
    """The same model in this process: what a single process answers."""
    return ModelHost([app_models[0]], device="cpu")


def values_for(api_name: str, **given) -> dict:
    api = APIS[api_name]
    return {**{name: p.default for name, p in api.signature.parameters.items()}, **given}


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


def test_two_replicas_answer_clients_each_with_the_single_process_text(cluster, local):
    expected = {i: last_update(local.run(APIS[name], values_for(name, **given)))[0]
                for i, (name, given) in enumerate(REQUESTS)}
    def answer(i: int) -> tuple[int, tuple]:
        name, given = REQUESTS[i]
        return i, remote_run(cluster, name, values_for(name, **given))

    with ThreadPoolExecutor(8) as clients:
        answers = list(clients.map(answer, [i % len(REQUESTS) for i in range(20)]))
    assert len({replica for _, (replica, _, _) in answers}) == 2  # both replicas served
    for i, (replica, text, outcome) in answers:
        assert outcome["kind"] == "done" and text == expected[i], (replica, REQUESTS[i])
    # OpenAI's API on each replica too, named by X-Replica
    completions = [httpx.post(f"{cluster}/v1/completions", json={"model": local.current.name, "prompt": "Hello",
                                                                 "max_tokens": 8, "seed": 5}, timeout=120)
                   for _ in range(4)]
    assert all(c.status_code == 200 and c.headers["x-replica"] for c in completions)
    assert len({c.json()["choices"][0]["text"] for c in completions}) == 1


def test_the_app_in_front_serves_every_tab_with_logprobs_compare_and_look_inside(cluster, local):
    backend = RemoteHost(cluster)
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
    summarize = values_for("summarize", **REQUESTS[4][1])
    texts, outcome, comparison = last_update(backend.run_compare(APIS["summarize"], summarize))
    expected = last_update(local.run_compare(APIS["summarize"], summarize))
    assert texts == expected[0] and comparison["diverges_at"] == expected[2]["diverges_at"] and outcome.ran
    view, alone = backend.look_inside("Once upon a time", 2, 1, "translate"), local.look_inside("Once upon a time", 2, 1, "translate")
    # the same tokens; their probabilities the same up to rounding (a replica sums on its own threads)
    assert [t for t, _ in view.seen.top_tokens] == [t for t, _ in alone.seen.top_tokens]
    assert [p for _, p in view.seen.top_tokens] == pytest.approx([p for _, p in alone.seen.top_tokens], rel=1e-4)
    assert view.lens.top_tokens == alone.lens.top_tokens


@pytest.mark.browser
def test_the_page_in_front_runs_a_tab_and_looks_inside(cluster, browser):
    from playwright.sync_api import expect

    with studio_app(RemoteHost(cluster)) as (_, url):
        page = open_app(browser, url)
        expect(page.locator("#model-info")).to_contain_text(f"served by {cluster}")
        page.locator("#generate-prompt textarea").fill("Once upon a time")
        page.locator("#generate-run").click()
        expect(page.locator("#generate-status")).to_contain_text(re.compile(r"seed \d+ · \d+ prompt"))
        page.get_by_role("tab", name="Architecture").click()
        page.locator("#architecture-run").click()
        expect(page.locator("#architecture-top")).to_contain_text("%")
        page.context.close()


def replicas() -> dict[str, str]:
    """Each live replica's actor name, by its replica id (X-Replica)."""
    import ray

    names = [actor["name"] for actor in ray.util.list_named_actors(all_namespaces=True)]
    return {name.rsplit("#", 1)[-1]: name for name in names if name.startswith("SERVE_REPLICA::")}


def test_a_replica_killed_mid_stream_ends_its_streams_with_a_retryable_error_and_the_others_finish(cluster):
    backend = RemoteHost(cluster)
    long_run = values_for("generate", prompt="Once upon a time", max_new_tokens=512, temperature=1.0, top_k=0,
                          no_repeat_ngram_size=0)
    started = [threading.Event() for _ in range(6)]

    def stream(i: int) -> list:
        updates = []
        for update in backend.run(APIS["generate"], {**long_run, "seed": i}):
            updates.append(update)
            started[i].set()
        return updates

    # Which replica a stream lands on is Ray's choice: start several, and kill one replica once all stream.
    with ThreadPoolExecutor(len(started)) as clients:
        runs = [clients.submit(stream, i) for i in range(len(started))]
        assert all(event.wait(120) for event in started)
        import ray

        live = replicas()
        assert len(live) == 2
        victim = sorted(live)[0]
        ray.kill(ray.get_actor(live[victim], namespace="serve"))  # its process ends at once
        ended = [future.result(timeout=300)[-1][1] for future in runs]
    cut = [outcome for outcome in ended if outcome.kind == "fault"]
    finished = [outcome for outcome in ended if outcome.kind == "done"]
    assert cut and finished and len(cut) + len(finished) == len(ended), ended
    assert all(o.message.key == "backend_cut" for o in cut)
    assert all(o.generated_tokens > 0 for o in finished)
    # Ray starts a new replica, and the deployment answers again
    assert wait_until(lambda: len(replicas()) == 2 and victim not in replicas(), timeout_s=120)
    assert wait_until(lambda: remote_run(cluster, "generate", values_for("generate", prompt="Hi", max_new_tokens=4))[2]
                      ["kind"] == "done", timeout_s=60)


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


def test_the_flags_set_the_replicas_their_cpus_and_the_autoscaling_bounds():
    from ray import serve

    from serve.cluster import Replica, build, parse_args, replica_options

    args = parse_args(["--replicas", "3", "--cpus-per-replica", "0.5", "--min-replicas", "1", "--max-replicas", "4",
                       "--port", "9000", "--address", "auto"])
    assert (args.replicas, args.cpus_per_replica, args.min_replicas, args.max_replicas, args.port, args.address) \
        == (3, 0.5, 1, 4, 9000, "auto")
    assert parse_args([]).port == 8000  # Ray Serve's own
    fixed = replica_options(3, 0.5)
    assert fixed["num_replicas"] == 3 and fixed["ray_actor_options"]["num_cpus"] == 0.5
    assert "autoscaling_config" not in fixed
    scaled = replica_options(2, 1, min_replicas=1, max_replicas=4)
    assert "num_replicas" not in scaled
    assert scaled["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 4, "initial_replicas": 2,
                                            "target_ongoing_requests": 8}
    for options in (fixed, scaled):  # Ray takes them
        serve.deployment(Replica).options(**options)
    assert build({"model": "bundled", "replicas": "1", "cpus_per_replica": "1"}) is not None  # `serve run`'s builder
