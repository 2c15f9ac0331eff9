"""Design references and etcd credentials, the pure rules (docs/security.md, "Design
references and etcd credentials"): what a design reference may name (serve's own design
store, or an https URL under an allowed prefix), how it is shown (never with a user name,
password or query), the allowed prefixes themselves, and which Secret may serve as a
cluster's credentials."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from metalmend.designs import designref
from metalmend.designs.designref import DesignRef, ReferenceRefused
from metalmend.serve.settings import ServeSettingsError, check
from metalmend.teardown.etcd import access
from metalmend.teardown.etcd.design import ClusterDesign, MemberDesign, SecretRef
from metalmend.web.settings import ServeSettings

STORE = "deckhand+https://deckhand-int.ucp:9000/api/v1.0/revisions/{}/rendered-documents"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        pytest.param(STORE.format(12), DesignRef("design revision 12", 12), id="the spec's form"),
        pytest.param(
            "deckhand+http://metalmend-serve/deckhand/api/v1.0/revisions/3/rendered-documents",
            DesignRef("design revision 3", 3), id="deckhand+http, metalmend's own prefix",
        ),
        pytest.param(
            "deckhand+https://d/revisions/4/documents", DesignRef("design revision 4", 4, False),
            id="documents (abstract ones included)",
        ),
        pytest.param(
            "deckhand+https://d/api/v1.0/revisions/5/rendered-documents?schema=promenade/EtcdClusters/v1",
            DesignRef("design revision 5", 5, True, (("schema", "promenade/EtcdClusters/v1"),)),
            id="Deckhand's filters kept",
        ),
        pytest.param(
            "https://designs.example:8443/site/a.yaml?token=x#top",
            DesignRef("https://designs.example:8443/site/a.yaml?...",
                      url="https://designs.example:8443/site/a.yaml?token=x"),
            id="an https URL: its query not shown, its fragment dropped",
        ),
    ],
)  # fmt: skip
def test_what_a_design_reference_names(raw: str, expected: DesignRef) -> None:
    assert designref.parse(raw) == expected


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        pytest.param("http://127.0.0.1:8080/x", "only deckhand+https://", id="cleartext http"),
        pytest.param("ftp://d/x", "only deckhand+https://", id="another scheme"),
        pytest.param("file:///etc/passwd", "is not a URL", id="a file"),
        pytest.param("deckhand+https:///x", "is not a URL", id="no host"),
        pytest.param("deckhand+https://d/api/v1.0/buckets/x", "names no revision", id="no revision"),
        pytest.param(
            "deckhand+https://d/revisions/1/rendered-documents?colour=red",
            "unknown query parameter 'colour'", id="a filter Deckhand does not know",
        ),
        pytest.param("https://admin:s3cret@d/x", "a user name or password", id="userinfo"),
        pytest.param("https://d/a/../b", "'..'", id="dot-dot"),
        pytest.param("https://d/a/%2e%2e/b", "encoded", id="encoded dot-dot"),
        pytest.param("https://d/a%2Fb", "encoded", id="encoded slash"),
        pytest.param("https://d:99999/x", "is not a URL", id="a port that is not one"),
        pytest.param("https://[::1/x", "is not a URL", id="an unclosed bracket"),
        pytest.param("https://d/" + "x" * 3000, "longer than 2048", id="too long"),
    ],
)  # fmt: skip
def test_references_refused_before_anything_is_read(raw: str, message: str) -> None:
    with pytest.raises(ReferenceRefused) as refused:
        designref.parse(raw)
    assert message in str(refused.value)


@pytest.mark.parametrize(
    "raw",
    [
        "https://admin:s3cret@designs.example/x",
        "http://admin:s3cret@127.0.0.1:9/x",
        "deckhand+https://admin:s3cret@d/revisions/x",
        "https://designs.example/x?token=s3cret",
        "deckhand+https://d/revisions/1/rendered-documents?metadata.name=s3cret",
        "ftp://u:s3cret@d/",
    ],
)
def test_a_reference_never_echoes_its_credentials(raw: str) -> None:
    try:
        ref = designref.parse(raw)
        designref.allowed(ref, ())
        said = ref.shown
    except ReferenceRefused as refused:
        said = str(refused)
    assert "s3cret" not in said
    assert "s3cret" not in designref.shown(raw)


def test_a_store_reference_needs_no_allowed_prefix() -> None:
    designref.allowed(designref.parse(STORE.format(1)), ())


PREFIXES = [designref.prefix("https://designs.example/site-a/"), designref.prefix("https://b:8443")]


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("https://designs.example/site-a/etcd.yaml", True),
        ("https://DESIGNS.example:443/site-a/x/y", True),
        ("https://designs.example/site-a", True),
        ("https://designs.example/site-ab/x", False),
        ("https://designs.example/site-b/x", False),
        ("https://designs.example:8443/site-a/x", False),
        ("https://designs.example.evil/site-a/x", False),
        ("https://b:8443/anything", True),
        ("https://b/anything", False),
        ("https://127.0.0.1/site-a/x", False),
    ],
)
def test_allowed_prefixes_match_host_port_and_path(url: str, allowed: bool) -> None:
    ref = designref.parse(url)
    if allowed:
        designref.allowed(ref, PREFIXES)
    else:
        with pytest.raises(ReferenceRefused, match="is not allowed"):
            designref.allowed(ref, PREFIXES)


def test_no_url_is_allowed_by_default() -> None:
    with pytest.raises(ReferenceRefused, match=r"serve.design_url_prefixes \(none\)"):
        designref.allowed(designref.parse("https://designs.example/x"), ())


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("http://designs.example/", "not an https URL"),
        ("https://u:p@designs.example/", "no user name or password"),
        ("https://designs.example/?x=1", "no query"),
        ("https://designs.example/a/../b", "no '.', '..'"),
        ("designs.example/x", "is not a URL"),
        ("https://designs.example:0x/", "is not a URL"),
    ],
)
def test_allowed_prefixes_are_plain_https(raw: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        designref.prefix(raw)


# ---- which Secret may serve as a cluster's credentials ---------------------------------------

REF = SecretRef("kube-system", "etcd-client")
LABEL = {access.SECRET_LABEL: "true"}


@pytest.mark.parametrize(
    ("labels", "annotations", "named", "why"),
    [
        pytest.param(LABEL, {access.CLUSTERS_ANNOTATION: "kubernetes"}, (), None, id="bound"),
        pytest.param(LABEL, {access.CLUSTERS_ANNOTATION: " other , kubernetes"}, (), None,
                     id="bound among others"),
        pytest.param(LABEL, {}, ("kube-system/etcd-client",), None, id="named in the settings"),
        pytest.param(LABEL, {access.CLUSTERS_ANNOTATION: "other"}, (), "not bound",
                     id="bound to another cluster"),
        pytest.param(LABEL, {access.CLUSTERS_ANNOTATION: "*"}, (), "not bound",
                     id="no wildcard"),
        pytest.param(LABEL, {}, ("kube-system/other",), "not bound", id="another Secret named"),
        pytest.param({}, {access.CLUSTERS_ANNOTATION: "kubernetes"}, ("kube-system/etcd-client",),
                     "not labelled", id="unlabelled, even if bound and named"),
        pytest.param({"metalmend.dev/bmc-credentials": "true"},
                     {"metalmend.dev/bmc-hosts": "*"}, (), "not labelled", id="a BMC Secret"),
        pytest.param({access.SECRET_LABEL: "yes"}, {access.CLUSTERS_ANNOTATION: "kubernetes"}, (),
                     "not labelled", id="label value other than true"),
    ],
)  # fmt: skip
def test_which_secret_may_be_a_clusters_credentials(
    labels: dict[str, str], annotations: dict[str, str], named: tuple[str, ...], why: str | None
) -> None:
    found = access.usable(REF, "kubernetes", labels, annotations, named)
    assert (found is None) if why is None else (why in (found or "")), found


def cluster(*urls: str) -> ClusterDesign:
    members = tuple(MemberDesign(f"n{i}", f"n{i}", (u,), ()) for i, u in enumerate(urls))
    return ClusterDesign("kubernetes", 1, members, REF)


async def test_credentials_are_not_read_for_a_cluster_with_an_http_client_url() -> None:
    asked: list[SecretRef] = []

    async def secrets(ref: SecretRef, name: str) -> dict[str, bytes]:
        asked.append(ref)
        return {"username": b"root", "password": b"pw"}

    with pytest.raises(access.CredentialsRefused, match="not https") as refused:
        await access.connect(cluster("https://10.0.0.1:2379", "http://10.0.0.2:2379"), secrets)
    assert "nothing was sent" in str(refused.value)
    assert asked == []


def test_the_access_log_never_shows_a_design_refs_credentials() -> None:
    from metalmend.serve.server import RedactedAccessLog

    path = (
        "/promenade/api/v1.0/etcd-cluster-health-statuses?design_ref="
        "https%3A%2F%2Fadmin%3As3cret%40designs.example%2Fx%3Ftoken%3Ds3cret"
    )
    record = logging.LogRecord(
        "uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:5000", "GET", path, "1.1", 400), None,
    )  # fmt: skip
    assert RedactedAccessLog().filter(record)
    line = record.getMessage()
    assert "s3cret" not in line
    assert "design_ref=https://designs.example/x%3F..." in line
    plain = "/promenade/api/v1.0/nodes/n1/drain?timeout=10"
    assert designref.redact_path(plain) == plain


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (ServeSettings(design_url_prefixes=("http://d/",)), "serve.design_url_prefixes: http://d/"),
        (ServeSettings(design_url_prefixes=("https://u:p@d/",)), "no user name or password"),
        (ServeSettings(etcd_credentials_secrets=("etcd-client",)), "is not namespace/name"),
        (ServeSettings(design_ca_bundle=Path("/nonexistent.pem")), "cannot read /nonexistent.pem"),
    ],
)
def test_serve_refuses_settings_that_would_widen_what_a_design_reaches(
    settings: ServeSettings, message: str
) -> None:
    with pytest.raises(ServeSettingsError, match=message):
        check(settings)
