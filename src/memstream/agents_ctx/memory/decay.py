"""Hygiene rules: expiry and importance decay, as pure functions of an entry and ``now``.

- An entry whose ``expires_at`` has passed is expired, and only then: ``expires_at`` is the
  one expiry, read the same way by recall, pinning and this pass (an observation gets
  ``expires_at`` = store or replace + 30 days, so one replaced on day 20 lives until day
  50, not day 30). Only an observation with no ``expires_at`` at all (a row written
  without one) falls back to 30 days after creation.
- ``project_fact`` and ``observation`` entries not recalled in 90 days (or, if never
  recalled, not created/replaced in 90 days) step their importance down by 0.1, never below
  0.1. ``user_profile`` is never decayed.
- The 90 days restart after each step (``last_decayed_at``), so a daily pass lowers an
  untouched entry by one step per 90 days, not by 0.1 every day once it has gone stale.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Literal

from memstream.schemas.limits import DECAY_AFTER_DAYS, DECAY_FLOOR, DECAY_STEP, OBSERVATION_TTL_DAYS
from memstream.schemas.records import MemoryEntry

DECAYING_CATEGORIES: tuple[str, ...] = ("project_fact", "observation")
DECAY_AFTER = timedelta(days=DECAY_AFTER_DAYS)
OBSERVATION_TTL = timedelta(days=OBSERVATION_TTL_DAYS)

HygieneAction = Literal["expire", "decay", "keep"]


def should_expire(entry: MemoryEntry, now: datetime) -> bool:
    """Past its ``expires_at``; an observation without one, 30 days after creation."""
    if entry.expires_at is not None:
        return entry.expires_at <= now
    return entry.category == "observation" and entry.created_at + OBSERVATION_TTL <= now


def last_activity(entry: MemoryEntry, last_decayed_at: datetime | None = None) -> datetime:
    """When the entry was last recalled — or, if never, last written — or last decayed."""
    base = entry.last_recalled_at or entry.updated_at
    if last_decayed_at is not None and last_decayed_at > base:
        return last_decayed_at
    return base


def decayed_importance(importance: float) -> float:
    """One step down (0.1), floored at 0.1, rounded to kill float drift (0.7 → 0.6, not 0.59999)."""
    return max(DECAY_FLOOR, round(importance - DECAY_STEP, 6))


def should_decay(
    entry: MemoryEntry, now: datetime, last_decayed_at: datetime | None = None
) -> bool:
    """A decaying category, above the floor, untouched for 90 days."""
    if entry.category not in DECAYING_CATEGORIES:
        return False
    if entry.importance <= DECAY_FLOOR:
        return False
    return last_activity(entry, last_decayed_at) + DECAY_AFTER <= now


def hygiene_action(
    entry: MemoryEntry, now: datetime, last_decayed_at: datetime | None = None
) -> HygieneAction:
    if should_expire(entry, now):
        return "expire"
    if should_decay(entry, now, last_decayed_at):
        return "decay"
    return "keep"
