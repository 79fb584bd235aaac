"""The engine past one machine: N replicas of the service layer as a Ray Serve deployment.

    python -m serve.cluster [--model NAME ...] [--replicas N] [--cpus-per-replica C]
                            [--min-replicas A --max-replicas B] [--port 8000] [--address ADDRESS]
    serve run serve.cluster:build model=bundled replicas=2        (Ray's own CLI, the same app)

Two deployments, composed (Ray Serve's model composition):

- the model's replicas (ModelReplica, the deployment DEPLOYMENT): each one process holding the
  model with all its adapters (ModelHost) and its own continuous batching (engine/scheduler.py),
  so any replica answers any request. Each serves OpenAI's /v1 API (serve/openai_api.py) and what
  a page in front needs (serve/page_api.py: `python app.py --backend URL`), and says which replica
  answered in the X-Replica header of every response. Ray restarts a replica that dies, replaces
  one whose health check fails (its decode loop has stopped), adds replicas while requests queue
  and removes them when idle (--min-replicas/--max-replicas), letting a replica being removed
  finish its streams first (DRAIN_S);
- the ingress (Ingress, INGRESS): what Ray Serve's HTTP proxy sends every request to. It holds no
  model: it forwards each request to a replica through a DeploymentHandle and the answer back
  (serve/ingress.py), and it is what a client can rely on when a replica stops. A request whose
  replica stops before sending anything goes to another replica, with the same seed, so its
  client only waits longer (X-Retries says how often); a stream whose replica stops after sending
  text ends with what says so: an error event in OpenAI's shape on /v1, an outcome record of the
  fault on /studio. (Ray's proxy alone closes such a stream as if it had ended.)

Replicas start with this checkout on their PYTHONPATH: on a cluster of several machines the
checkout (and its .venv) must be at the same path on each (docs/scale-out.md).
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import threading
from pathlib import Path
from typing import AsyncIterator

import torch
from ray import serve
from ray.exceptions import RayActorError
from ray.serve.exceptions import ReplicaUnavailableError
from ray.serve.handle import DeploymentHandle
from starlette.applications import Starlette
from starlette.routing import Mount

from engine.scheduler import MAX_BATCH

from .admission import DEFAULT_CONCURRENCY
from .ingress import Forwarder, answered
from .model_host import BUNDLED, ModelHost
from .replica import DEFAULT_CAPACITY, replica_app

REPO = Path(__file__).resolve().parent.parent
APP, DEPLOYMENT, INGRESS = "studio", "studio", "ingress"  # Ray's names: SERVE_REPLICA::studio#studio#<id>
# What ended a replica's part, as Ray tells the caller: its process died or is unreachable.
REPLICA_GONE = (RayActorError, ReplicaUnavailableError)
# A decode loop that has made no progress this long while requests wait is wedged (check_health).
# A turn takes milliseconds on the bundled model and a few seconds for a long prompt's chunk on
# gpt2-xl on a CPU.
STALL_S = 30
HEALTH_CHECK_PERIOD_S = 5  # at most: a shorter stall_s is checked more often (health_check_period)
UNHEALTHY_AFTER = 3  # failed checks in a row after which Ray replaces a replica (Ray Serve's own count)
# How long a replica being removed (scaling down, a redeploy) may take to finish its requests: a
# 512-token stream of the bundled model takes about 25 s on this project's 2-core machine with 15
# others beside it (docs/scale-out.md).
DRAIN_S = 120
DRAIN_POLL_S = 1  # how often the replica being removed looks whether its requests have ended
SCALE_DOWN_S = 600  # autoscaling: how long the load must ask for fewer replicas before one goes (Ray's default)
log = logging.getLogger(__name__)


class ModelReplica:
    """A replica of the model: loaded once when Ray starts the replica; its HTTP app (replica_app)
    answers the requests the ingress forwards (http)."""

    def __init__(self, models: list[str], device: str = "cpu", quantize: str | None = None,
                 threads: int = 1, api_key: str | None = None, capacity: int = DEFAULT_CAPACITY,
                 stall_s: float = STALL_S, test_hooks: bool = False):
        torch.set_num_threads(threads)  # the CPUs Ray gave this replica, not the machine's
        # its runs, decoding or waiting, at most `capacity`: those Ray lets through (max_ongoing_requests)
        self.host = ModelHost(models, device=device, quantize=quantize, queue_size=capacity - DEFAULT_CONCURRENCY)
        self.replica = serve.get_replica_context().replica_id.unique_id
        self.app = replica_app(self.host, self.replica, api_key)
        self.stall_s, self.test_hooks, self.failed_checks = stall_s, test_hooks, 0

    async def http(self, asked: dict) -> AsyncIterator[dict | bytes]:
        """One request the ingress forwards, answered by this replica's app (ingress.answered). The
        ingress cancelling it (its client gone) ends the request's runs and frees their rows."""
        async for piece in answered(self.app, asked):
            yield piece

    async def check_health(self) -> None:
        """Ray's health check (every health_check_period): it fails while the decode loop has made
        no progress for stall_s with requests waiting (the scheduler's stalled_s). After
        UNHEALTHY_AFTER failures in a row Ray marks the replica unhealthy and replaces it; this
        process then ends itself, since Ray's graceful stop would keep its stuck requests waiting
        for DRAIN_S, when ended now the ingress sends those that have shown nothing to another
        replica and ends the others' streams saying so."""
        stalled = self.host.current.scheduler.stalled_s()
        if stalled <= self.stall_s:
            self.failed_checks = 0
            return
        self.failed_checks += 1
        log.error("replica %s: its decode loop has made no progress for %.0f s while requests wait (check %d of %d)",
                  self.replica, stalled, self.failed_checks, UNHEALTHY_AFTER)
        if self.failed_checks >= UNHEALTHY_AFTER:
            asyncio.get_running_loop().call_later(1, os._exit, 1)  # once Ray has this check's answer
        raise RuntimeError(f"the decode loop has made no progress for {stalled:.0f} s while requests wait")

    def wedge(self) -> str:
        """For the tests only (a deployment built with test_hooks, and reached through a handle,
        never over HTTP): this replica's decode loop blocks for good at its next model call, as a
        wedged loop would. Returns the replica's id (X-Replica)."""
        if not self.test_hooks:
            raise PermissionError("this deployment was not built with test_hooks")
        never = threading.Event()
        self.host.current.model.register_forward_pre_hook(lambda module, args: never.wait())
        return self.replica


@serve.ingress()
class Ingress:
    """What Ray's HTTP proxy sends every request to: serve/ingress.py's Forwarder, calling a model
    replica through `model` (a DeploymentHandle) and told when one has died (REPLICA_GONE)."""

    def __init__(self, model: DeploymentHandle):
        self.model = model.options(stream=True)

    def __serve_build_asgi_app__(self) -> Starlette:
        return Starlette(routes=[Mount("/", app=Forwarder(self.model.http.remote, REPLICA_GONE))])


def replica_options(replicas: int = 2, cpus_per_replica: float = 1, min_replicas: int | None = None,
                    max_replicas: int | None = None, device: str = "cpu", capacity: int = DEFAULT_CAPACITY,
                    drain_s: float = DRAIN_S, stall_s: float = STALL_S, scale_down_s: float = SCALE_DOWN_S) -> dict:
    """Ray Serve's options for the model's replicas: `replicas` of them, or with min/max_replicas as
    many as the load asks for between them (Ray's autoscaling: about 8 requests in flight per
    replica, the rows of its decode batch; one is removed once fewer have been asking for
    scale_down_s), each with `cpus_per_replica` CPUs reserved; the health
    check (check_health, every health_check_period(stall_s)) and the drain of one being removed (at
    most drain_s)."""
    if min_replicas is None and max_replicas is None:
        scaling = {"num_replicas": replicas}
    else:
        low = 1 if min_replicas is None else min_replicas
        scaling = {"autoscaling_config": {"min_replicas": low, "max_replicas": max(max_replicas or replicas, low),
                                          "initial_replicas": min(max(replicas, low), max(max_replicas or replicas, low)),
                                          "target_ongoing_requests": MAX_BATCH,
                                          "downscale_delay_s": scale_down_s}}
    return {"name": DEPLOYMENT, "max_ongoing_requests": capacity, **scaling,
            "health_check_period_s": health_check_period(stall_s), "graceful_shutdown_timeout_s": drain_s,
            "graceful_shutdown_wait_loop_s": DRAIN_POLL_S,
            "ray_actor_options": {"num_cpus": cpus_per_replica, "num_gpus": 1 if device == "cuda" else 0,
                                  "runtime_env": runtime_env()}}


def health_check_period(stall_s: float) -> float:
    """How often Ray checks a replica's health: a wedged loop is replaced about stall_s plus
    UNHEALTHY_AFTER periods after it stopped, which a shorter stall_s shortens too."""
    return min(HEALTH_CHECK_PERIOD_S, max(1.0, stall_s / UNHEALTHY_AFTER))


def ingress_options(most_requests: int, drain_s: float = DRAIN_S) -> dict:
    """The ingress's: one replica that reserves no CPU (it forwards bytes), taking every request
    the model's replicas can hold at once (`most_requests`)."""
    return {"name": INGRESS, "num_replicas": 1, "max_ongoing_requests": most_requests,
            "graceful_shutdown_timeout_s": drain_s, "graceful_shutdown_wait_loop_s": DRAIN_POLL_S,
            "ray_actor_options": {"num_cpus": 0, "runtime_env": runtime_env()}}


def runtime_env() -> dict:
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return {"env_vars": {"PYTHONPATH": path}}


def deployment(models: list[str], replicas: int = 2, cpus_per_replica: float = 1, min_replicas: int | None = None,
               max_replicas: int | None = None, device: str = "cpu", quantize: str | None = None,
               api_key: str | None = None, capacity: int = DEFAULT_CAPACITY, stall_s: float = STALL_S,
               drain_s: float = DRAIN_S, scale_down_s: float = SCALE_DOWN_S, test_hooks: bool = False):
    """The Ray Serve application: the ingress in front of replicas of `models` (replica_options).
    `test_hooks` lets the tests wedge a replica (ModelReplica.wedge)."""
    options = replica_options(replicas, cpus_per_replica, min_replicas, max_replicas, device, capacity, drain_s,
                              stall_s, scale_down_s)
    threads = max(1, int(cpus_per_replica))
    model = serve.deployment(ModelReplica).options(**options)
    front = serve.deployment(Ingress).options(**ingress_options(capacity * max(replicas, max_replicas or 0), drain_s))
    return front.bind(model.bind(models, device, quantize, threads, api_key, capacity, stall_s, test_hooks))


def model_replicas() -> dict[str, str]:
    """Each live replica of the model (not the ingress): its Ray actor's name by its replica id
    (X-Replica). What a test or a benchmark kills to see a replica die."""
    import ray

    names = [actor["name"] for actor in ray.util.list_named_actors(all_namespaces=True)]
    own = f"SERVE_REPLICA::{APP}#{DEPLOYMENT}#"
    return {name.rsplit("#", 1)[-1]: name for name in names if name.startswith(own)}


def build(args: dict):
    """`serve run serve.cluster:build model=NAME[,NAME] replicas=N cpus_per_replica=C ...`, and a
    Serve config's (`serve deploy`, KubeRay's RayService) import_path with its args. (test_hooks=1:
    the tests' ModelReplica.wedge.)"""
    models = [name for name in str(args.get("model", BUNDLED)).split(",") if name]
    floats = ("cpus_per_replica", "stall_s", "drain_s", "scale_down_s")
    numbers = {key: float(args[key]) if key in floats else int(args[key])
               for key in ("replicas", "min_replicas", "max_replicas", *floats) if key in args}
    return deployment(models, **numbers, device=args.get("device", "cpu"), quantize=args.get("quantize"),
                      api_key=args.get("api_key"), test_hooks=str(args.get("test_hooks", "")) in ("1", "true"))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m serve.cluster", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", action="append", help="a model to serve (default: the bundled one)")
    p.add_argument("--replicas", type=int, default=2, help="replicas to start with (default 2)")
    p.add_argument("--cpus-per-replica", type=float, default=1, help="CPUs Ray reserves for each (default 1)")
    p.add_argument("--min-replicas", type=int, help="autoscaling: the fewest replicas")
    p.add_argument("--max-replicas", type=int, help="autoscaling: the most replicas")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where each replica runs its model")
    p.add_argument("--quantize", choices=["int8"], help="int8 weights in every replica (engine/quantize.py)")
    p.add_argument("--stall-s", type=float, default=STALL_S,
                   help=f"a replica whose decode loop makes no progress this long while requests wait is "
                        f"replaced (default {STALL_S})")
    p.add_argument("--drain-s", type=float, default=DRAIN_S,
                   help=f"how long a replica being removed may take to finish its requests (default {DRAIN_S})")
    p.add_argument("--scale-down-s", type=float, default=SCALE_DOWN_S,
                   help=f"autoscaling: how long the load must ask for fewer replicas before one is removed "
                        f"(default {SCALE_DOWN_S}, Ray's)")
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
                     args.max_replicas, args.device, args.quantize, api_key=args.api_key, stall_s=args.stall_s,
                     drain_s=args.drain_s, scale_down_s=args.scale_down_s)
    print(f"serving on http://{args.host}:{args.port} (/v1, /studio); Ctrl-C stops", flush=True)
    serve.run(app, name=APP, route_prefix="/", blocking=True)


if __name__ == "__main__":
    main()
