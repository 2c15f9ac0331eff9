"""BMC credentials from the Secret named by ``spec.bmc.credentialsName``, in the host's
own namespace only: a host must not be able to borrow another tenant's credentials."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping

from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import Secret

from metalmend.bmc.errors import CredentialsError
from metalmend.bmc.pool import Credentials


def from_secret_data(data: Mapping[str, str] | None, where: str) -> Credentials:
    """Decode a Secret's base64 ``data``; surrounding whitespace is trimmed."""
    values: dict[str, str] = {}
    for key in ("username", "password"):
        raw = (data or {}).get(key)
        if raw is None:
            raise CredentialsError(f"Secret {where} has no {key!r} key")
        try:
            values[key] = base64.b64decode(raw, validate=True).decode().strip()
        except (binascii.Error, UnicodeDecodeError):
            raise CredentialsError(f"Secret {where}: {key!r} is not valid base64 text") from None
        if not values[key]:
            raise CredentialsError(f"Secret {where}: {key!r} is empty")
    return Credentials(values["username"], values["password"])


async def load(client: AsyncClient, namespace: str, credentials_name: str | None) -> Credentials:
    if not credentials_name:
        raise CredentialsError("spec.bmc.credentialsName is not set")
    if "/" in credentials_name:
        raise CredentialsError(
            f"spec.bmc.credentialsName {credentials_name!r} points outside the host's"
            f" namespace; the Secret must be in {namespace!r}"
        )
    where = f"{namespace}/{credentials_name}"
    try:
        secret = await client.get(Secret, credentials_name, namespace=namespace)
    except ApiError as error:
        if error.status.code == 404:
            raise CredentialsError(f"Secret {where} not found") from None
        raise CredentialsError(f"cannot read Secret {where}: {error.status.code}") from None
    return from_secret_data(secret.data, where)
