"""Autocast helpers that also work on devices without autocast (the meta device, for deferred init)."""

from __future__ import annotations

import contextlib

import torch


def autocast_off(device_type: str) -> contextlib.AbstractContextManager:
    """``torch.autocast(device_type, enabled=False)``, or a no-op where the device has no autocast (meta)."""
    if torch.amp.is_autocast_available(device_type):
        return torch.autocast(device_type, enabled=False)
    return contextlib.nullcontext()


def autocast_enabled(device_type: str) -> bool:
    """Whether autocast is on for ``device_type`` (False where the device has no autocast)."""
    return torch.amp.is_autocast_available(device_type) and torch.is_autocast_enabled(device_type)
