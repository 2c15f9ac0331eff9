"""Who asks, and what they ask for, in RBAC's terms: a ``Permission`` (a verb on a resource
and subresource of an API group, as a SubjectAccessReview names it) and a ``Caller`` (the
user a TokenReview answered). The gate of ``metalmend serve`` (``metalmend.web.auth``)
asks the API server; a site action asks again as its caller (``metalmend.siteactions``)."""

from __future__ import annotations

from dataclasses import dataclass

from metalmend.kube.impersonate import Who

API_GROUP = "promenade.metalmend.dev"


@dataclass(frozen=True)
class Permission:
    """What an endpoint asks RBAC: ``verb`` on ``resource/subresource`` in ``group``."""

    resource: str
    subresource: str
    verb: str
    group: str = API_GROUP

    def describe(self) -> str:
        resource = f"{self.resource}/{self.subresource}" if self.subresource else self.resource
        return f"{self.verb} {resource} ({self.group})"


@dataclass(frozen=True)
class Caller:
    username: str
    uid: str
    groups: tuple[str, ...]
    extra: dict[str, list[str]]

    def who(self) -> Who:
        """The caller as impersonation names them (kube.impersonate)."""
        return Who(
            self.username, self.uid, self.groups, {k: tuple(v) for k, v in self.extra.items()}
        )

    @classmethod
    def of(cls, who: Who) -> Caller:
        return cls(who.username, who.uid, who.groups, {k: list(v) for k, v in who.extra.items()})
