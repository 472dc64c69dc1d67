"""POSIX-shaped access to a store, validating every commit; no FUSE in here."""

from __future__ import annotations

from n5fs.gateway.commit.rules import Mode, Rejection
from n5fs.gateway.config import GatewayConfig
from n5fs.gateway.gateway import Gateway
from n5fs.gateway.namespace.paths import Attr, EntryKind

__all__ = ["Attr", "EntryKind", "Gateway", "GatewayConfig", "Mode", "Rejection"]
