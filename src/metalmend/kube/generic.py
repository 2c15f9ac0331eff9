"""One parse of a generic resource's metadata per object, not one per look.

Every custom resource metalmend reads (BareMetalHosts, Machines, Metal3Machines, checks,
remediations) is a lightkube ``Generic``: a dict whose ``.metadata`` property builds a new
``ObjectMeta`` from the metadata dict on every access. A health check's evaluation looks
at each Machine's metadata about ten times; at 5,000 Machines that was 13 % of the
controller's CPU while verdicts were being reached (a py-spy profile of the scale lab,
docs/scale.md, fix 17), and host-power's routine poll pays it too.

``install`` makes the property keep the ``ObjectMeta`` it built on the object, beside the
metadata dict it was built from, and build it again only when that dict was replaced.
metalmend treats cached objects as read-only: a write builds a new body, and a change
to a cached object arrives as a new object from the watch. The one in-place change,
``kube.informer.without_managed_fields``, calls ``forget``.
"""

from __future__ import annotations

from typing import Any, cast

from lightkube.generic_resource import Generic
from lightkube.models.meta_v1 import ObjectMeta

_KEPT = "_metalmend_metadata"  # in the object's __dict__: (metadata dict, its ObjectMeta)


def metadata(obj: Generic) -> ObjectMeta | None:
    meta = obj.get("metadata")
    if meta is None or isinstance(meta, ObjectMeta):
        return meta
    kept = obj.__dict__.get(_KEPT)
    if kept is not None and kept[0] is meta:
        parsed: ObjectMeta = kept[1]
        return parsed
    parsed = cast(ObjectMeta, ObjectMeta.from_dict(meta))
    obj.__dict__[_KEPT] = (meta, parsed)
    return parsed


def forget(obj: Any) -> None:
    """The metadata dict of ``obj`` was changed in place: parse it again at the next look."""
    if isinstance(obj, Generic):
        obj.__dict__.pop(_KEPT, None)


def install() -> None:
    """Idempotent; done when ``metalmend.kube`` is imported."""
    Generic.metadata = property(metadata)  # type: ignore[assignment,method-assign]
