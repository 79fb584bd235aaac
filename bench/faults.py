"""Faults a client of a deployment sees: N clients streaming through the deployment while a replica
of the model is killed every K seconds.

    python -m bench.faults [--clients 16] [--seconds 120] [--kill-every 30] [--replicas 2]
                           [--model bundled] [--json PATH]

Starts a local Ray instance (a CPU per replica) with the deployment of serve/cluster.py on it, takes
the answer of each of a fixed set of seeded requests alone (one at a time, before the run), then
has each client stream one of them after another until the time is up: 3 of 4 through /v1 (raw
server-sent events), 1 of 4 through /studio's JSON lines. Every K seconds one live replica of the
model is killed (its process ends at once, as a machine lost would), and Ray starts another.

Each stream is counted by how it ended:
- completed: /v1's finish_reason and `data: [DONE]`, /studio's done outcome; its text is checked
  against the seed's text alone (a retry must give the same text);
- retried: sent again to another replica before any text (X-Retries), whatever its end;
- error event: OpenAI's error event, or /studio's fault outcome, saying the replica stopped;
- refused: an HTTP error before any text (every replica tried stopped: a 503);
- silently cut: none of these, what a client would take for a whole answer (the target is 0).
The first text's latency is given for the streams started in the 10 s before each kill and in
the 10 s after it, and how long Ray took to have as many replicas again.
"""
from __future__ import annotations

import argparse
import json
import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from engine.kernels import BUILDING
from serve.apis import APIS
from serve.cluster import APP, DEPLOYMENT, deployment, model_replicas

from .load import free_port, percentile

PROMPTS = ["Once upon a time", "The little fox looked at the moon and", "Tom and his dog went to the park.",
           "Lily found a box in the garden.", "The old king said", "One day, a bird flew into the kitchen"]
WINDOW_S = 10  # the streams started this long before and after a kill are compared
MAX_TOKENS = 256
STUDIO_SHARE = 0.25


@dataclass
class Ask:
    route: str  # "v1" or "studio"
    prompt: str
    seed: int


@dataclass
class Record:
    """One stream, as its client saw it."""
    route: str
    started: float  # seconds since the run began
    first_text_s: float | None = None
    retries: int = 0
    ending: str = ""  # completed, error event, refused, silently cut
    text_checked: bool = False
    text_wrong: bool = False
    detail: str = ""


def stream(url: str, model: str, ask: Ask) -> tuple[str, float | None, int, str, str]:
    """`ask` streamed to its end: (its ending, the first text's latency, X-Retries, its text, what else)."""
    begun, first, retries, text = time.monotonic(), None, 0, ""
    if ask.route == "v1":
        path, body = "/v1/completions", {"model": model, "prompt": ask.prompt, "max_tokens": MAX_TOKENS,
                                         "temperature": 1.0, "seed": ask.seed, "stream": True}
    else:
        defaults = {name: p.default for name, p in APIS["generate"].signature.parameters.items()}
        path, body = "/studio/run/generate", {**defaults, "prompt": ask.prompt, "max_new_tokens": MAX_TOKENS,
                                              "temperature": 1.0, "top_k": 0, "seed": ask.seed}
    items = []
    try:
        with httpx.stream("POST", url + path, json=body, timeout=300) as response:
            retries = int(response.headers.get("x-retries", 0))
            if response.status_code != 200:
                response.read()
                return "refused", None, retries, "", f"HTTP {response.status_code}: {response.text[:120]}"
            for line in response.iter_lines():
                if ask.route == "v1" and not line.startswith("data: "):
                    continue
                item = line.removeprefix("data: ")
                items.append(item)
                if first is None and item != "[DONE]":
                    data = json.loads(item)
                    if (data.get("choices") or [{}])[0].get("text") or data.get("text"):
                        first = time.monotonic() - begun
    except httpx.HTTPError as error:  # the connection itself broke: said, though not in the API's words
        return "connection error", first, retries, "", type(error).__name__
    if ask.route == "v1":
        chunks = [json.loads(item) for item in items if item != "[DONE]"]
        text = "".join(chunk["choices"][0]["text"] for chunk in chunks if chunk.get("choices"))
        if items[-1:] == ["[DONE]"] and chunks and chunks[-1]["choices"][0]["finish_reason"]:
            return "completed", first, retries, text, ""
        if chunks and "error" in chunks[-1]:
            return "error event", first, retries, text, chunks[-1]["error"]["message"]
        return "silently cut", first, retries, text, f"{len(items)} events"
    last = json.loads(items[-1]) if items else {}
    outcome = last.get("outcome")
    if outcome is None:
        return "silently cut", first, retries, last.get("text", ""), f"{len(items)} lines"
    if outcome["kind"] == "done":
        return "completed", first, retries, last["text"], ""
    return "error event", first, retries, last["text"], outcome["message"]["key"]


def settled(url: str, model: str, timeout_s: float = 600) -> str:
    """The decode path once the replicas' kernels are built (their answers are compared with ones
    taken on it: docs/api.md, "Seeds")."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            path = httpx.get(url + "/v1/models", timeout=30).headers.get("x-decode-path", BUILDING)
        except httpx.HTTPError:
            path = BUILDING
        if path != BUILDING or time.monotonic() > deadline:
            return path
        time.sleep(2)


def run(url: str, model: str, clients: int, seconds: float, kill_every: float, replicas: int, seed: int) -> dict:
    import ray

    asks = [Ask("studio" if i % 4 == 3 else "v1", PROMPTS[i % len(PROMPTS)], 1000 + i) for i in range(16)]
    alone = {}
    for ask in asks:
        ending, _, _, text, detail = stream(url, model, ask)
        assert ending == "completed", (ask, ending, detail)
        alone[(ask.route, ask.seed)] = text
    records: list[Record] = []
    kills: list[dict] = []
    lock = threading.Lock()
    begun = time.monotonic()
    deadline = begun + seconds

    def client(index: int) -> None:
        rng = random.Random(seed * 1000 + index)
        while time.monotonic() < deadline:
            ask = rng.choice(asks)
            record = Record(ask.route, time.monotonic() - begun)
            record.ending, record.first_text_s, record.retries, text, record.detail = stream(url, model, ask)
            if record.ending == "completed":
                record.text_checked = True
                record.text_wrong = text != alone[(ask.route, ask.seed)]
            with lock:
                records.append(record)

    def killer() -> None:
        rng = random.Random(seed)
        for at in [kill_every * k for k in range(1, int(seconds // kill_every) + 1) if kill_every * k < seconds]:
            time.sleep(max(0.0, begun + at - time.monotonic()))
            live = model_replicas()
            victim = rng.choice(sorted(live))
            ray.kill(ray.get_actor(live[victim], namespace="serve"))
            killed = time.monotonic()
            kill = {"at_s": round(killed - begun, 1), "replica": victim, "replaced_after_s": None}
            kills.append(kill)
            while time.monotonic() < killed + 120:  # until a new replica runs (answers) beside the others
                now = set(model_replicas())
                if victim not in now and now - set(live) and running() >= replicas:
                    kill["replaced_after_s"] = round(time.monotonic() - killed, 1)
                    break
                time.sleep(0.2)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    threads.append(threading.Thread(target=killer, daemon=True))
    for thread in threads:
        thread.start()
    for thread in threads[:-1]:
        thread.join()
    return summarize(records, kills, time.monotonic() - begun)


def running() -> int:
    """How many replicas of the model Ray has running (a new one: once its model is loaded)."""
    from ray import serve

    app = serve.status().applications.get(APP)
    return 0 if app is None or DEPLOYMENT not in app.deployments else \
        app.deployments[DEPLOYMENT].replica_states.get("RUNNING", 0)


def summarize(records: list[Record], kills: list[dict], elapsed_s: float) -> dict:
    def latency(group: list[Record]) -> dict:
        values = [r.first_text_s * 1000 for r in group if r.first_text_s is not None]
        return {"streams": len(group), "p50_ms": percentile(values, 50), "p95_ms": percentile(values, 95),
                "max_ms": max(values) if values else None}
    endings = {name: sum(r.ending == name for r in records)
               for name in ("completed", "error event", "refused", "connection error", "silently cut")}
    for kill in kills:
        at = kill["at_s"]
        kill["before"] = latency([r for r in records if at - WINDOW_S <= r.started < at])
        kill["after"] = latency([r for r in records if at <= r.started < at + WINDOW_S])
    return {"requests": len(records), **endings, "retried": sum(r.retries > 0 for r in records),
            "retries": sum(r.retries for r in records),
            "checked": sum(r.text_checked for r in records), "wrong_text": sum(r.text_wrong for r in records),
            "first_text_all": latency(records), "kills": kills, "elapsed_s": round(elapsed_s, 1),
            "examples": sorted({f"{r.ending}: {r.detail}" for r in records if r.detail})[:10]}


def table(report: dict) -> str:
    def ms(value):
        return "-" if value is None else f"{value:.0f}"
    lines = [f"{report['clients']} clients streaming for {report['seconds']} s, a replica of "
             f"{report['replicas']} killed every {report['kill_every']} s ({report['model']}, decoding on "
             f"{report['decode_path']})", "",
             "| requests | completed | of them retried | ended with an error event | refused | connection errors | "
             "silently cut | wrong text |", "|---:|---:|---:|---:|---:|---:|---:|---:|",
             f"| {report['requests']} | {report['completed']} | {report['retried']} | {report['error event']} | "
             f"{report['refused']} | {report['connection error']} | {report['silently cut']} | "
             f"{report['wrong_text']} of {report['checked']} |", "",
             "| kill at | replaced after | first text before: p50 / p95 / max (ms) | after: p50 / p95 / max (ms) |",
             "|---:|---:|---:|---:|"]
    for kill in report["kills"]:
        before, after = kill["before"], kill["after"]
        replaced = "-" if kill["replaced_after_s"] is None else f"{kill['replaced_after_s']} s"
        lines.append(f"| {kill['at_s']} s | {replaced} | {ms(before['p50_ms'])} / {ms(before['p95_ms'])} / "
                     f"{ms(before['max_ms'])} | {ms(after['p50_ms'])} / {ms(after['p95_ms'])} / {ms(after['max_ms'])} |")
    every = report["first_text_all"]
    lines += ["", f"first text over the whole run: p50 {ms(every['p50_ms'])} ms, p95 {ms(every['p95_ms'])} ms, "
                  f"max {ms(every['max_ms'])} ms"]
    if report["examples"]:
        lines += ["", "examples:", *(f"- {line}" for line in report["examples"])]
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.faults", description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=16, help="concurrent streaming clients (default 16)")
    p.add_argument("--seconds", type=float, default=120, help="how long they keep streaming (default 120)")
    p.add_argument("--kill-every", type=float, default=30, help="a replica killed every this many seconds (default 30)")
    p.add_argument("--replicas", type=int, default=2, help="replicas of the model (default 2), a CPU each")
    p.add_argument("--model", default="bundled", help="the model they serve (default the bundled one)")
    p.add_argument("--seed", type=int, default=0, help="seeds the clients' choices and the replicas killed")
    p.add_argument("--json", type=Path, help="also write the report to this JSON file")
    return p.parse_args(argv)


def main(argv=None) -> None:
    import ray
    from ray import serve

    args = parse_args(argv)
    ray.init(num_cpus=args.replicas, include_dashboard=False, log_to_driver=False)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(deployment([args.model], replicas=args.replicas), name=APP, route_prefix="/")
    url = f"http://127.0.0.1:{port}"
    try:
        path = settled(url, args.model)
        report = run(url, args.model, args.clients, args.seconds, args.kill_every, args.replicas, args.seed)
    finally:
        serve.shutdown()
        ray.shutdown()
    report = {"clients": args.clients, "seconds": args.seconds, "kill_every": args.kill_every,
              "replicas": args.replicas, "model": args.model, "decode_path": path, **report}
    print(table(report), flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
