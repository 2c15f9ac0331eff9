"""Section ``serve`` read for ``metalmend serve``: the checks the settings loader cannot
make alone (``check``) and the parts of the application it configures (``read``: the
section itself is ``metalmend.web.settings``; what is built of it,
``metalmend.serve.root``)."""

from __future__ import annotations

from dataclasses import dataclass

from metalmend.designs import designref
from metalmend.teardown.etcd.routes import EtcdAccess
from metalmend.web import auth
from metalmend.web.bodies import BodyLimits
from metalmend.web.settings import ServeSettings, is_loopback


class ServeSettingsError(ValueError):
    """Settings ``metalmend serve`` cannot start with; the message says which and why."""


def check(settings: ServeSettings) -> None:
    """Raise ServeSettingsError for combinations the settings loader cannot see alone."""
    # serve.port's range, like every number's, is the loader's (metalmend.settings.RANGES)
    if settings.metrics_bind and not _host_port(settings.metrics_bind):
        raise ServeSettingsError(
            f"serve.metrics_bind must be host:port, not {settings.metrics_bind[:100]!r}"
        )
    if (settings.tls_cert is None) != (settings.tls_key is None):
        raise ServeSettingsError("serve.tls_cert and serve.tls_key go together: give both")
    for path in (settings.tls_cert, settings.tls_key):
        if path is not None and not path.is_file():
            raise ServeSettingsError(f"cannot read {path}: no such file")
    for raw in settings.design_url_prefixes:
        try:
            designref.prefix(raw)
        except ValueError as error:
            raise ServeSettingsError(f"serve.design_url_prefixes: {error}") from None
    if settings.design_ca_bundle is not None and not settings.design_ca_bundle.is_file():
        raise ServeSettingsError(f"cannot read {settings.design_ca_bundle}: no such file")
    for raw in settings.etcd_credentials_secrets:
        namespace, _, name = raw.partition("/")
        if not namespace or not name or "/" in name:
            raise ServeSettingsError(
                f"serve.etcd_credentials_secrets: {raw[:100]!r} is not namespace/name"
            )
    if settings.tls_cert is None and not is_loopback(settings.bind_address):
        raise ServeSettingsError(
            f"serve.bind_address {settings.bind_address} is not a loopback address: give"
            " serve.tls_cert and serve.tls_key (callers send bearer tokens)"
        )


def _host_port(bind: str) -> bool:
    host, _, port = bind.rpartition(":")
    return bool(host) and port.isdigit() and 0 < int(port) <= 65535


@dataclass(frozen=True)
class ServeParts:
    """What section ``serve`` configures in the application (``metalmend.serve.root``)."""

    limits: auth.Limits
    etcd_access: EtcdAccess
    bodies: BodyLimits
    site_namespaces: tuple[str, ...]
    site_label_prefixes: tuple[str, ...]


def read(settings: ServeSettings) -> ServeParts:
    """The section checked (``check``: raises ServeSettingsError) and read."""
    check(settings)
    return ServeParts(
        limits=auth.Limits(
            token_cache_seconds=settings.token_cache_seconds,
            token_cache_size=settings.token_cache_size,
            auth_failures_burst=settings.auth_failures_burst,
            auth_failure_interval=settings.auth_failure_interval,
        ),
        etcd_access=EtcdAccess.from_settings(
            settings.design_url_prefixes,
            settings.etcd_credentials_secrets,
            settings.design_ca_bundle,
        ),
        bodies=BodyLimits.of(
            settings.max_body_bytes, settings.max_design_documents, settings.max_design_values
        ),
        site_namespaces=settings.site_namespaces,
        site_label_prefixes=settings.site_label_prefixes,
    )
