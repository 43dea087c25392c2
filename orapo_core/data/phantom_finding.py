"""What the PhantomCXR renderer and report writer read of a drawn finding.

`orapo_core.data.phantom.Finding` is the finding itself; it imports both of them, so they name it by this
protocol rather than import it back (as `phantom_io.WrittenStudy` names a study). Each attribute is read
only, with the type `Finding` gives it: which of them a kind of finding sets is `phantom.sample_findings`'s rule.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

T = TypeVar("T")


class DrawnFinding(Protocol):
    @property
    def kind(self) -> str: ...

    @property
    def side(self) -> str | None: ...  # "right", "left", "bilateral"

    @property
    def severity(self) -> str | None: ...

    @property
    def location(self) -> str | None: ...  # zone (upper/middle/lower), rib number, or device name

    @property
    def variant(self) -> str | None: ...

    @property
    def certain(self) -> bool: ...

    @property
    def size(self) -> float | None: ...  # cardiothoracic ratio, or lesion radius (normalised units)


def required(value: T | None, what: str) -> T:
    """An attribute that this kind of finding always has (`phantom.sample_findings` sets it): a finding without it is
    malformed, and said to be, rather than drawn or written as "None"."""
    if value is None:
        raise ValueError(f"this PhantomCXR finding has no {what}")
    return value
