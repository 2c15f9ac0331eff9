"""Whether a bearer token was signed by the cluster's ServiceAccount issuer: its JWT
signature checked against the public keys the API server publishes (``/openid/v1/jwks``,
Kubernetes' ServiceAccount issuer discovery), before any TokenReview.

It is how ``metalmend serve`` tells a fresh ServiceAccount token from garbage without
asking the API server (docs/security.md, "What a token costs the API server"): a token
that verifies was issued by the API server (nobody else holds its signing key); whether it
is still valid (its ServiceAccount, Secret or Pod still there) only a TokenReview says.
The signature proves issuance, never validity: it only decides whose budget the review
is charged to.

Pure: ``Keys`` parses a JWKS document, ``Keys.signed`` checks a token; fetching the
document is the gate's (web/auth.py). RS256/384/512 and ES256/384/512, the algorithms
the API server signs ServiceAccount tokens with (RSA or ECDSA keys).
"""

from __future__ import annotations

import base64
import binascii
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

MAX_TOKEN = 16_384  # characters; a ServiceAccount token is about 1,000
_HASHES: Mapping[str, Callable[[], hashes.HashAlgorithm]] = {
    "256": hashes.SHA256, "384": hashes.SHA384, "512": hashes.SHA512,
}  # fmt: skip
_CURVES: Mapping[str, ec.EllipticCurve] = {
    "P-256": ec.SECP256R1(), "P-384": ec.SECP384R1(), "P-521": ec.SECP521R1(),
}  # fmt: skip


def _b64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _integer(text: str) -> int:
    return int.from_bytes(_b64(text), "big")


PublicKey = rsa.RSAPublicKey | ec.EllipticCurvePublicKey


@dataclass(frozen=True)
class Keys:
    """The issuer's public keys by key id ("" for a key without one)."""

    by_id: Mapping[str, PublicKey] = field(default_factory=dict)

    @classmethod
    def parse(cls, document: object) -> Keys:
        """The RSA and EC signing keys of a JWKS document; anything else is skipped."""
        found: dict[str, PublicKey] = {}
        entries = document.get("keys") if isinstance(document, Mapping) else None
        for entry in entries if isinstance(entries, list) else ():
            if not isinstance(entry, Mapping) or entry.get("use", "sig") != "sig":
                continue
            try:
                key = _public_key(entry)
            except (KeyError, TypeError, ValueError, binascii.Error):
                continue
            if key is not None:
                found[str(entry.get("kid") or "")] = key
        return cls(found)

    def signed(self, token: str, now: Callable[[], float] = time.time) -> bool | None:
        """True: a JWT these keys signed, not expired; False: not one (garbage, another
        issuer's, expired, a bad signature); None: signed with a key id these keys lack
        (the issuer's keys may have rotated: fetch them again)."""
        parts = token.split(".")
        if len(token) > MAX_TOKEN or len(parts) != 3:
            return False
        try:
            header, claims = json.loads(_b64(parts[0])), json.loads(_b64(parts[1]))
            signature = _b64(parts[2])
        except (ValueError, binascii.Error):
            return False
        if not isinstance(header, dict) or not isinstance(claims, dict):
            return False
        algorithm, kid = header.get("alg"), header.get("kid")
        if not isinstance(algorithm, str) or algorithm[:2] not in ("RS", "ES"):
            return False
        hash_of = _HASHES.get(algorithm[2:])
        if hash_of is None:
            return False
        expires = claims.get("exp")
        if isinstance(expires, bool) or not isinstance(expires, int | float | None):
            return False
        if expires is not None and expires <= now():
            return False
        if isinstance(kid, str) and kid:
            if kid not in self.by_id:
                return None
            candidates = [self.by_id[kid]]
        else:
            candidates = list(self.by_id.values())
        signed_part = f"{parts[0]}.{parts[1]}".encode()
        return any(_verifies(k, algorithm, hash_of(), signed_part, signature) for k in candidates)


def _public_key(entry: Mapping[str, Any]) -> PublicKey | None:
    if entry.get("kty") == "RSA":
        return rsa.RSAPublicNumbers(_integer(entry["e"]), _integer(entry["n"])).public_key()
    if entry.get("kty") == "EC" and entry.get("crv") in _CURVES:
        curve = _CURVES[entry["crv"]]
        numbers = ec.EllipticCurvePublicNumbers(_integer(entry["x"]), _integer(entry["y"]), curve)
        return numbers.public_key()
    return None


def _verifies(
    key: PublicKey, algorithm: str, digest: hashes.HashAlgorithm, data: bytes, signature: bytes
) -> bool:
    try:
        if algorithm.startswith("RS") and isinstance(key, rsa.RSAPublicKey):
            key.verify(signature, data, padding.PKCS1v15(), digest)
            return True
        if algorithm.startswith("ES") and isinstance(key, ec.EllipticCurvePublicKey):
            half = len(signature) // 2
            if half == 0 or len(signature) % 2:
                return False
            der = encode_dss_signature(
                int.from_bytes(signature[:half], "big"), int.from_bytes(signature[half:], "big")
            )
            key.verify(der, data, ec.ECDSA(digest))
            return True
    except (InvalidSignature, ValueError):
        return False
    return False
