"""/healthz, /readyz and /metrics for a running manager, on 127.0.0.1 by default (any
IPv4 or IPv6 address; ``[::1]`` as well as ``::1``). What ready and live mean is in
kube/manager.py; each answers 200 "ok", or 503 with one line per reason."""

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
        return _answer(manager.not_live(), "not live")

    @app.get("/readyz")
    def readyz() -> Response:
        problems = manager.not_ready()
        if problems and not manager.synced():
            return _answer(problems, "caches not synced")
        return _answer(problems, "not ready")

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    return app


def _answer(problems: list[str], title: str) -> Response:
    if not problems:
        return Response("ok", media_type="text/plain")
    lines = "\n".join(problems)
    return Response(f"{title}:\n{lines}\n", 503, media_type="text/plain")


def bind_address(host: str, port: int) -> socket.socket:
    """A listening-ready TCP socket on ``host`` (IPv4, IPv6 with or without brackets, or a
    name), or OSError in one line."""
    literal = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    shown = f"[{literal}]:{port}" if ":" in literal else f"{literal}:{port}"
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            literal, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as error:
        raise OSError(f"cannot serve health endpoints on {shown}: {error.strerror}") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as error:
        sock.close()
        raise OSError(f"cannot serve health endpoints on {shown}: {error.strerror}") from None
    return sock


@contextlib.asynccontextmanager
async def serving(manager: Manager, host: str, port: int) -> AsyncIterator[int]:
    """Serve the endpoints for the duration of the block; yields the bound port."""
    # Bind here, not in uvicorn: a taken port is then an OSError we can report in one
    # line, where uvicorn would log and call sys.exit.
    sock = bind_address(host, port)
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
