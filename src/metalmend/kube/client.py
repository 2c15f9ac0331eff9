"""Connecting to a cluster: a kubeconfig path, else in-cluster, else $KUBECONFIG or
~/.kube/config; and one start-up probe that says clearly what is wrong."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import httpx2
import yaml
from lightkube import ApiError, AsyncClient, ConfigError, KubeConfig
from lightkube.resources.authentication_v1 import SelfSubjectReview

FIELD_MANAGER = "metalmend"


class ClusterUnavailable(RuntimeError):
    """The cluster cannot be used; the message is one line a user can act on."""


def load_config(kubeconfig: Path | None) -> KubeConfig:
    """Read ``kubeconfig``, or find a configuration as kubectl would when it is None."""
    try:
        if kubeconfig is None:
            return KubeConfig.from_env()
        data = yaml.safe_load(Path(kubeconfig).expanduser().read_text())
        if not isinstance(data, dict):
            raise ClusterUnavailable(f"cannot read {kubeconfig}: not a kubeconfig (not a mapping)")
        if missing := [k for k in ("clusters", "contexts") if not isinstance(data.get(k), list)]:
            raise ClusterUnavailable(
                f"cannot read {kubeconfig}: not a kubeconfig (no {' or '.join(missing)} list)"
            )
        return KubeConfig.from_dict(data, fname=str(kubeconfig))
    except FileNotFoundError:
        raise ClusterUnavailable(f"cannot read kubeconfig: {kubeconfig} does not exist") from None
    except ConfigError as error:
        raise ClusterUnavailable(f"cannot read kubeconfig: {error}") from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(error, "problem", None) or "invalid YAML"
        raise ClusterUnavailable(f"cannot read {kubeconfig}: not YAML{where}: {problem}") from None
    except (OSError, KeyError, TypeError, ValueError, AttributeError) as error:
        source = kubeconfig or "the default kubeconfig"
        text = " ".join(str(error).split())  # one line, whatever the library said
        raise ClusterUnavailable(f"cannot read {source}: {type(error).__name__}: {text}") from None


def async_client(config: KubeConfig) -> AsyncClient:
    return AsyncClient(config, field_manager=FIELD_MANAGER)


@dataclass(frozen=True)
class Identity:
    username: str
    groups: tuple[str, ...]


async def whoami(client: AsyncClient, server: str = "") -> Identity:
    """Ask the server who we are (SelfSubjectReview): proves it is reachable and that our
    credentials work, and tells the operator which identity RBAC must allow."""
    try:
        review = await client.create(SelfSubjectReview())
    except ApiError as error:
        raise ClusterUnavailable(
            f"the API server {server} refused our credentials:"
            f" {error.status.code} {error.status.message}"
        ) from None
    except (httpx2.HTTPError, OSError) as error:
        text = " ".join(str(error).split())
        raise ClusterUnavailable(f"cannot reach the API server {server}: {text}") from None
    info = review.status.userInfo if review.status else None
    if info is None:
        return Identity("unknown", ())
    return Identity(info.username or "unknown", tuple(info.groups or ()))
