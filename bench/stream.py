"""Streaming through the app: tokens/s of 1 and of N gradio_client clients streaming /generate at once.

    python -m bench.stream URL [URL ...] [--clients 1 8] [--tokens 200] [--rounds 3]

Each URL is an app already running on loopback (`python app.py --port P`): one on main and one
on a change, say, so that they are measured side by side. The rounds alternate between them and
each number is the median of --rounds. Every client streams a seeded request of --tokens tokens
(fewer where it meets the end of text) and counts the updates it receives, so the table also
shows how often the app sends text. tokens/s runs from the first submit to the last answer, so
it includes each request's own cost (Gradio's queue, gradio_client), not only the streaming. The
clients run in this process, on the app's machine: on a 2-core CPU they take part of it.
"""
from __future__ import annotations

import argparse
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

from gradio_client import Client

from bench.load import STATUS, watch


def stream_once(clients: list[Client], tokens: int) -> tuple[float, float]:
    """(generated tokens/s over all clients, median updates per request) for one request per
    client, from the first submit to the last answer."""

    def request(i: int) -> tuple[int, int]:
        job = clients[i].submit(prompt="Once upon a time", temperature=0.8, top_k=40, max_new_tokens=tokens,
                                seed=i, api_name="/generate")
        watch(job, cancel=None)  # looks every 10 ms, as a user of bench.load does: Job's own iterator spins
        _, status, _, _ = job.result()  # raises the app's error, if any
        return int(STATUS.match(status).group(3)), len(job.outputs())

    start = time.perf_counter()
    with ThreadPoolExecutor(len(clients)) as pool:
        answers = list(pool.map(request, range(len(clients))))
    elapsed = time.perf_counter() - start
    return sum(n for n, _ in answers) / elapsed, statistics.median(u for _, u in answers)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.stream", description=__doc__.split("\n\n")[0])
    p.add_argument("urls", nargs="+", help="apps running on loopback")
    p.add_argument("--clients", type=int, nargs="+", default=[1, 8], help="numbers of clients at once")
    p.add_argument("--tokens", type=int, default=200, help="max_new_tokens of each request")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    clients = {url: [Client(url, verbose=False) for _ in range(max(args.clients))] for url in args.urls}
    samples: dict = {(url, n): [] for url in args.urls for n in args.clients}
    for rep in range(args.rounds + 1):  # the first round warms up
        for (url, n), values in samples.items():
            result = stream_once(clients[url][:n], args.tokens)
            if rep:
                values.append(result)
                print(f"  round {rep}/{args.rounds}: {url}, {n} clients: {result[0]:.0f} tokens/s", flush=True)
    print(f"\n{args.tokens} tokens a request, median of {args.rounds} rounds\n")
    print("| app | clients | tokens/s, all clients (submit to last answer) | updates a request |\n|---|---:|---:|---:|")
    for (url, n), values in samples.items():
        print(f"| {url} | {n} | {statistics.median(v for v, _ in values):.0f} | "
              f"{statistics.median(u for _, u in values):.0f} |")


if __name__ == "__main__":
    main()
