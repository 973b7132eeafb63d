"""quickmap's multi-host test rig: two network-namespace hosts reached over real SSH (see core.py)."""

from .core import Rig, RigHost, cleanup_stale, unavailable_reason

__all__ = ["Rig", "RigHost", "cleanup_stale", "unavailable_reason"]
