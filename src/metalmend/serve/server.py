"""Running ``metalmend serve``: uvicorn over the application, HTTPS when given a
certificate, against the cluster of the kubeconfig.

HTTPS is TLS 1.2 or 1.3 only, whatever the Python and OpenSSL defaults of the image are,
and TLS 1.2 only with forward-secret AEAD suites (Mozilla's "intermediate" list without
DHE: ECDHE key exchange, AES-GCM or ChaCha20-Poly1305), so no CBC or SHA-1 suite and no
RSA key exchange; TLS 1.3's suites are all of that kind (OpenSSL's defaults)."""

from __future__ import annotations

import asyncio
import logging
import ssl

import uvicorn

from metalmend.bmc import BmcPool
from metalmend.db import Database
from metalmend.designs import designref
from metalmend.kube.client import async_client, load_config, whoami
from metalmend.serve import root
from metalmend.serve.app import create_app
from metalmend.serve.settings import read
from metalmend.serve.storeguard import StoreRefused, guard
from metalmend.settings import Settings
from metalmend.web import metrics as webmetrics

log = logging.getLogger(__name__)

TLS_MINIMUM = ssl.TLSVersion.TLSv1_2
TLS12_CIPHERS = ":".join(
    (
        "ECDHE-ECDSA-AES128-GCM-SHA256",
        "ECDHE-RSA-AES128-GCM-SHA256",
        "ECDHE-ECDSA-AES256-GCM-SHA384",
        "ECDHE-RSA-AES256-GCM-SHA384",
        "ECDHE-ECDSA-CHACHA20-POLY1305",
        "ECDHE-RSA-CHACHA20-POLY1305",
    )
)


def harden(config: uvicorn.Config) -> uvicorn.Config:
    """``config`` loaded, its TLS context (uvicorn's: the certificate, the key) set to TLS
    1.2 at the least and our suites; done here rather than through uvicorn's options, whose
    defaults and names have changed between its releases."""
    config.load()
    if config.ssl is not None:
        config.ssl.minimum_version = TLS_MINIMUM
        config.ssl.set_ciphers(TLS12_CIPHERS)
    return config


class RedactedAccessLog(logging.Filter):
    """uvicorn's access log line without the credentials a ``design_ref`` may carry
    (its args: client address, method, path with query, HTTP version, status)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) == 5 and isinstance(args[2], str):
            record.args = (args[0], args[1], designref.redact_path(args[2]), *args[3:])
        return True


ACCESS_LOG_FILTER = RedactedAccessLog()


async def serve(settings: Settings) -> None:
    """Serve until interrupted. Raises ServeSettingsError, ClusterUnavailable, OSError
    (the port is taken), DatabaseError (StoreRefused: the database holds another store
    than the one recorded in the cluster) before serving anything."""
    parts = read(settings.serve)  # section serve checked before anything is opened
    access_log = logging.getLogger("uvicorn.access")
    if ACCESS_LOG_FILTER not in access_log.filters:
        access_log.addFilter(ACCESS_LOG_FILTER)
    database = await asyncio.to_thread(open_database, settings.serve.database_url)
    config = load_config(settings.runtime.kubeconfig)
    client = async_client(config)
    pool = BmcPool(settings.bmc)  # drives only (destroy's wipe): power is host-power's
    options = settings.serve
    stop_metrics = webmetrics.listen(options.metrics_bind)  # serve's /metrics, no token
    try:
        # Fails fast, in one line, when the cluster or our credentials do not work.
        current = config.get()
        identity = await whoami(client, current.cluster.server if current else "?")
        log.info("serving as %s", identity.username)
        try:
            await guard(client, database, options, identity.username)  # the store it served
        except StoreRefused:
            database.discard()  # a SQLite file this start created: removed, nothing left
            raise
        app = create_app(root.from_settings(settings, parts, client, database, pool))
        listening = uvicorn.Config(
            app,
            host=options.bind_address,
            port=options.port,
            ssl_certfile=str(options.tls_cert) if options.tls_cert else None,
            ssl_keyfile=str(options.tls_key) if options.tls_key else None,
            log_config=None,  # ours (metalmend.log), not uvicorn's
            access_log=True,
            lifespan="on",  # starts and stops the task worker (destroy/worker.py)
        )
        server = uvicorn.Server(harden(listening))
        where = f"{options.bind_address}:{options.port}"
        try:
            await server.serve()
        except SystemExit:  # uvicorn's answer to a port it cannot bind (it logged why)
            raise OSError(f"cannot listen on {where}") from None
        if not server.started:
            raise OSError(f"cannot listen on {where}")
    finally:
        stop_metrics()
        await client.close()
        await pool.close()
        database.dispose()


def open_database(url: str) -> Database:
    """Open the database and bring its schema to head (created if new)."""
    database = Database.open(url)
    try:
        database.upgrade()
    except BaseException:
        database.dispose()
        raise
    log.info("database ready: %s", database.where)
    return database
