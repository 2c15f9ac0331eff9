"""A token signed by the cluster's ServiceAccount issuer, told from garbage without a
TokenReview (web/signed.py; docs/security.md, "What a token costs the API server"): tokens
signed here with keys made for the test, checked against their JWKS."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

from metalmend.web.signed import Keys

NOW = 1_800_000_000.0
RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
EC_KEY = ec.generate_private_key(ec.SECP256R1())
OTHER_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def number(value: int, size: int | None = None) -> str:
    return b64(value.to_bytes(size or (value.bit_length() + 7) // 8, "big"))


def jwks() -> dict[str, Any]:
    public = RSA_KEY.public_key().public_numbers()
    point = EC_KEY.public_key().public_numbers()
    return {"keys": [
        {"use": "sig", "kty": "RSA", "kid": "rsa-1", "alg": "RS256",
         "n": number(public.n), "e": number(public.e)},
        {"use": "sig", "kty": "EC", "kid": "ec-1", "alg": "ES256", "crv": "P-256",
         "x": number(point.x, 32), "y": number(point.y, 32)},
        {"use": "enc", "kty": "oct", "k": "c2VjcmV0"},  # not a signing key: skipped
    ]}  # fmt: skip


def token(
    key: Any = RSA_KEY, alg: str = "RS256", kid: str | None = "rsa-1", exp: float | None = NOW + 600
) -> str:
    header = {"alg": alg, **({"kid": kid} if kid is not None else {})}
    claims = {"sub": "system:serviceaccount:t1:caller", **({"exp": exp} if exp else {})}
    signed = f"{b64(json.dumps(header).encode())}.{b64(json.dumps(claims).encode())}"
    if alg.startswith("ES"):
        r, s = decode_dss_signature(key.sign(signed.encode(), ec.ECDSA(hashes.SHA256())))
        signature = r.to_bytes(32, "big") + s.to_bytes(32, "big")
    else:
        signature = key.sign(signed.encode(), padding.PKCS1v15(), hashes.SHA256())
    return f"{signed}.{b64(signature)}"


def tampered(text: str) -> str:
    head, claims, signature = text.split(".")
    other = json.loads(base64.urlsafe_b64decode(claims + "=="))
    other["sub"] = "system:serviceaccount:kube-system:admin"
    return f"{head}.{b64(json.dumps(other).encode())}.{signature}"


@pytest.mark.parametrize(
    ("presented", "signed"),
    [
        (token(), True),
        (token(EC_KEY, "ES256", "ec-1"), True),
        (token(kid=None), True),  # no key id: any of the issuer's keys may have signed it
        (token(exp=None), True),  # a legacy Secret's token never expires
        (token(OTHER_KEY), False),  # another key claiming the issuer's key id
        (token(OTHER_KEY, kid=None), False),
        (tampered(token()), False),  # claims changed after signing
        (token(exp=NOW - 1), False),  # expired: the review would refuse it
        (token(OTHER_KEY, kid="rotated-2"), None),  # a key id unknown: fetch the keys again
        ("garbage-17", False),
        ("a.b.c", False),
        ("x" * 20_000, False),
        (token(alg="HS256"), False),  # a shared-secret JWT: never the issuer's
        (token(alg="none"), False),
    ],
)
def test_only_tokens_the_issuers_keys_signed_and_not_expired_count_as_signed(
    presented: str, signed: bool | None
) -> None:
    assert Keys.parse(jwks()).signed(presented, now=lambda: NOW) is signed


@pytest.mark.parametrize("document", [None, {}, {"keys": "x"}, {"keys": [{"kty": "RSA"}]}, []])
def test_a_jwks_document_that_is_not_one_gives_no_keys(document: object) -> None:
    assert Keys.parse(document).by_id == {}
    assert Keys.parse(document).signed(token(kid=None), now=lambda: NOW) is False
