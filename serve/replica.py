"""One replica's HTTP app, without Ray: OpenAI's /v1 (serve/openai_api.py) and what a page in
front needs (serve/page_api.py) on one model host, each response naming the replica that sent it
(X-Replica). serve/cluster.py runs it as Ray Serve replicas; the tests also serve it alone."""
from __future__ import annotations

from fastapi import FastAPI

from .admission import DEFAULT_CONCURRENCY, DEFAULT_QUEUE_SIZE
from .model_host import ModelHost
from .openai_api import openai_routes
from .page_api import page_routes

REPLICA_HEADER = b"x-replica"
DEFAULT_CAPACITY = DEFAULT_CONCURRENCY + DEFAULT_QUEUE_SIZE  # runs a replica holds, decoding or waiting, as the app


class NamedReplica:
    """ASGI middleware: every response says which replica sent it. (Starlette's BaseHTTPMiddleware
    would buffer the streams it wraps and hide a client that leaves from the handler.)"""

    def __init__(self, app, replica: str):
        self.app, self.replica = app, replica.encode()

    async def __call__(self, scope, receive, send):
        async def send_named(message):
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (REPLICA_HEADER, self.replica)]
            await send(message)
        await self.app(scope, receive, send_named)


def replica_app(host: ModelHost, replica: str, api_key: str | None = None) -> FastAPI:
    """One replica's HTTP app: /v1 and /studio on `host`, every response named by `replica`; the
    runs of both take their turn in the host's one queue."""
    app = FastAPI(title="Pre-LN GPT-2 Studio replica", docs_url=None, redoc_url=None)
    app.include_router(openai_routes(host, api_key=api_key))
    app.include_router(page_routes(host, api_key))
    app.add_middleware(NamedReplica, replica=replica)
    return app


def main(argv=None) -> None:
    """`python -m serve.replica`: one replica alone on this machine, as a backend for
    `python app.py --backend URL` without Ray (serve/cluster.py runs many)."""
    import argparse
    import os
    import socket

    import uvicorn

    from .model_host import BUNDLED

    p = argparse.ArgumentParser(prog="python -m serve.replica", description=main.__doc__.split("\n")[0])
    p.add_argument("--model", action="append", help="a model to serve (default: the bundled one)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--quantize", choices=["int8"], help="int8 weights (engine/quantize.py)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=os.environ.get("STUDIO_API_KEY") or None)
    args = p.parse_args(argv)
    host = ModelHost(args.model or [BUNDLED], device=args.device, quantize=args.quantize)
    uvicorn.run(replica_app(host, f"{socket.gethostname()}-{os.getpid()}", args.api_key), host=args.host,
                port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
