"""The sign-in guard's pieces that hold no lock and touch no database: what a sign-in attempt gets back, a lockout as
the admin list shows it, and the failure log whose holds double with each failure (`app.services.accounts.signin`
uses them)."""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from datetime import datetime
from typing import Generic, TypeVar

_Key = TypeVar("_Key", bound=Hashable)


@dataclass(frozen=True)
class SignInResult:
    outcome: str  # "signed_in", "refused" (wrong name or password, or a disabled account) or "locked"
    username: str | None = None
    stamp: str | None = None
    retry_after_s: int = 0
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.outcome == "signed_in"


@dataclass(frozen=True)
class Lockout:
    kind: str  # "account" or "address"
    key: str
    until: datetime


class FailureLog(Generic[_Key]):
    """Failed sign-ins per key within a moving window. After `free` of them, each further failure holds the key for a
    time that doubles from `first_s` up to `cap_s`, counted from the last failure: a guesser slows down at once, and
    nobody is held longer than `cap_s` after the last guess."""

    def __init__(self, free: int, window_s: float, first_s: float, cap_s: float) -> None:
        self.free, self.window_s, self.first_s, self.cap_s = free, window_s, first_s, cap_s
        self._failures: dict[_Key, list[float]] = {}

    def _recent(self, key: _Key, now: float) -> list[float]:
        times = [t for t in self._failures.get(key, ()) if now - t < self.window_s]
        if times:
            self._failures[key] = times
        else:
            self._failures.pop(key, None)
        return times

    def hit(self, key: _Key, now: float) -> None:
        self._failures.setdefault(key, []).append(now)

    def count(self, key: _Key, now: float) -> int:
        return len(self._recent(key, now))

    def held_until(self, key: _Key, now: float) -> float | None:
        times = self._recent(key, now)
        if len(times) < self.free:
            return None
        until = times[-1] + min(self.cap_s, self.first_s * 2 ** (len(times) - self.free))
        return until if until > now else None

    def clear(self, match: Callable[[_Key], bool]) -> None:
        for key in [k for k in self._failures if match(k)]:
            del self._failures[key]

    def keys(self) -> list[_Key]:
        return list(self._failures)


def held_refusal(what: str, wait_s: float) -> SignInResult:
    wait = max(1, math.ceil(wait_s))
    when = f"{wait} seconds" if wait < 120 else f"{math.ceil(wait / 60)} minutes"
    return SignInResult(
        "locked",
        retry_after_s=wait,
        message=(
            f"Too many failed sign-ins for this {what}: try again in {when}, "
            "or ask an administrator to lift the lockout."
        ),
    )


def account_key(username: str | None) -> str:
    return (username or "").strip().lower()[:64]
