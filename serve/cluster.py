"""The engine past one machine: N replicas of the service layer as a Ray Serve deployment.

    python -m serve.cluster [--model NAME ...] [--replicas N] [--cpus-per-replica C]
                            [--min-replicas A --max-replicas B] [--port 8000] [--address ADDRESS]
    serve run serve.cluster:build model=bundled replicas=2        (Ray's own CLI, the same app)

Each replica is one process holding the model with all its adapters (ModelHost) and its own
continuous batching (engine/scheduler.py), so any replica answers any request. Ray Serve's HTTP
proxy routes each request to a replica, streams its answer, restarts a replica that dies, and,
with --min-replicas/--max-replicas, adds replicas while requests queue and removes them when idle.
Each replica serves OpenAI's /v1 API (serve/openai_api.py) and what a page in front needs
(serve/page_api.py: `python app.py --backend URL`), and says which replica answered in the
X-Replica header of every response.

Replicas start with this checkout on their PYTHONPATH: on a cluster of several machines the
checkout (and its .venv) must be at the same path on each (docs/scale-out.md).
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
from fastapi import FastAPI
from ray import serve

from engine.scheduler import MAX_BATCH

from .model_host import BUNDLED, ModelHost
from .replica import DEFAULT_CAPACITY, replica_app

REPO = Path(__file__).resolve().parent.parent


@serve.ingress()
class Replica:
    """A replica: the model loaded once, the HTTP app built on it when Ray starts the replica."""

    def __init__(self, models: list[str], device: str = "cpu", quantize: str | None = None,
                 threads: int = 1, api_key: str | None = None, capacity: int = DEFAULT_CAPACITY):
        torch.set_num_threads(threads)  # the CPUs Ray gave this replica, not the machine's
        self.host = ModelHost(models, device=device, quantize=quantize)
        self.api_key, self.capacity = api_key, capacity

    def __serve_build_asgi_app__(self) -> FastAPI:
        replica = serve.get_replica_context().replica_id.unique_id
        return replica_app(self.host, replica, self.api_key, self.capacity)


def replica_options(replicas: int = 2, cpus_per_replica: float = 1, min_replicas: int | None = None,
                    max_replicas: int | None = None, device: str = "cpu", capacity: int = DEFAULT_CAPACITY) -> dict:
    """Ray Serve's options for the replicas: `replicas` of them, or with min/max_replicas as many
    as the load asks for between them (Ray's autoscaling: about 8 requests in flight per replica,
    the rows of its decode batch), each with `cpus_per_replica` CPUs reserved."""
    if min_replicas is None and max_replicas is None:
        scaling = {"num_replicas": replicas}
    else:
        low = 1 if min_replicas is None else min_replicas
        scaling = {"autoscaling_config": {"min_replicas": low, "max_replicas": max(max_replicas or replicas, low),
                                          "initial_replicas": min(max(replicas, low), max(max_replicas or replicas, low)),
                                          "target_ongoing_requests": MAX_BATCH}}
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return {"name": "studio", "max_ongoing_requests": capacity, **scaling,
            "ray_actor_options": {"num_cpus": cpus_per_replica, "num_gpus": 1 if device == "cuda" else 0,
                                  "runtime_env": {"env_vars": {"PYTHONPATH": path}}}}


def deployment(models: list[str], replicas: int = 2, cpus_per_replica: float = 1, min_replicas: int | None = None,
               max_replicas: int | None = None, device: str = "cpu", quantize: str | None = None,
               api_key: str | None = None, capacity: int = DEFAULT_CAPACITY):
    """The Ray Serve application: replicas of `models` (replica_options)."""
    options = replica_options(replicas, cpus_per_replica, min_replicas, max_replicas, device, capacity)
    threads = max(1, int(cpus_per_replica))
    return serve.deployment(Replica).options(**options).bind(models, device, quantize, threads, api_key, capacity)


def build(args: dict):
    """`serve run serve.cluster:build model=NAME[,NAME] replicas=N cpus_per_replica=C ...`."""
    models = [name for name in str(args.get("model", BUNDLED)).split(",") if name]
    numbers = {key: float(args[key]) if key == "cpus_per_replica" else int(args[key])
               for key in ("replicas", "cpus_per_replica", "min_replicas", "max_replicas") if key in args}
    return deployment(models, **numbers, device=args.get("device", "cpu"), quantize=args.get("quantize"),
                      api_key=args.get("api_key"))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m serve.cluster", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", action="append", help="a model to serve (default: the bundled one)")
    p.add_argument("--replicas", type=int, default=2, help="replicas to start with (default 2)")
    p.add_argument("--cpus-per-replica", type=float, default=1, help="CPUs Ray reserves for each (default 1)")
    p.add_argument("--min-replicas", type=int, help="autoscaling: the fewest replicas")
    p.add_argument("--max-replicas", type=int, help="autoscaling: the most replicas")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where each replica runs its model")
    p.add_argument("--quantize", choices=["int8"], help="int8 weights in every replica (engine/quantize.py)")
    p.add_argument("--host", default="127.0.0.1", help="the HTTP proxy's address (0.0.0.0: every interface)")
    p.add_argument("--port", type=int, default=8000, help="the HTTP proxy's port (default 8000, Ray Serve's)")
    p.add_argument("--address", help="an existing Ray cluster to join ('auto', or ray://HOST:10001); "
                                     "default: start one on this machine")
    p.add_argument("--api-key", default=os.environ.get("STUDIO_API_KEY") or None,
                   help="every /v1 request needs Authorization: Bearer KEY (default $STUDIO_API_KEY)")
    return p.parse_args(argv)


def main(argv=None) -> None:
    import ray

    args = parse_args(argv)
    ray.init(address=args.address)
    serve.start(http_options={"host": args.host, "port": args.port})
    app = deployment(args.model or [BUNDLED], args.replicas, args.cpus_per_replica, args.min_replicas,
                     args.max_replicas, args.device, args.quantize, api_key=args.api_key)
    print(f"serving on http://{args.host}:{args.port} (/v1, /studio); Ctrl-C stops", flush=True)
    serve.run(app, name="studio", route_prefix="/", blocking=True)


if __name__ == "__main__":
    main()
