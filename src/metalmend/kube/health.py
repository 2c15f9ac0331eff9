"""/healthz, /readyz and /metrics for a running manager, on 127.0.0.1 by default."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import uvicorn
from fastapi import FastAPI, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from metalmend.kube.manager import Manager


def health_app(manager: Manager) -> FastAPI:
    app = FastAPI(title="metalmend", docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/healthz")
    def healthz() -> Response:
        return Response("ok", media_type="text/plain")

    @app.get("/readyz")
    def readyz() -> Response:
        if manager.synced():
            return Response("ok", media_type="text/plain")
        waiting = "\n".join(manager.unsynced())
        return Response(f"caches not synced:\n{waiting}\n", 503, media_type="text/plain")

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    return app


@contextlib.asynccontextmanager
async def serving(manager: Manager, host: str, port: int) -> AsyncIterator[int]:
    """Serve the endpoints for the duration of the block; yields the bound port."""
    # Bind here, not in uvicorn: a taken port is then an OSError we can report in one
    # line, where uvicorn would log and call sys.exit.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        raise OSError(f"cannot serve health endpoints on {host}:{port}: {error.strerror}") from None
    bound: int = sock.getsockname()[1]
    config = uvicorn.Config(health_app(manager), log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        yield bound
    finally:
        server.should_exit = True
        await task
        sock.close()
