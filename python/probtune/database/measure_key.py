"""Where records were measured: a target, a device and a timing mode, and the key the database keeps them under.

The database, the measurement pipeline, bundles and reports share this value;
its :attr:`MeasureKey.text` is the string that records, cost-model states and
the ``measured_on`` table hold (``TARGET[+cold-llc]@DEVICE[#DIGEST]``).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, replace

__all__ = ["COLD_CACHE", "MeasureKey"]

COLD_CACHE = "+cold-llc"
"""After the target's name in the key of records timed with emptied caches: their latencies are not warm ones."""

_DIGEST_LENGTH = 8
_DIGEST = rf"[0-9a-f]{{{_DIGEST_LENGTH}}}"
_WITH_DIGEST = re.compile(rf"(?P<device>.*)#(?P<digest>{_DIGEST})", re.DOTALL)


@dataclass(frozen=True)
class MeasureKey:
    """The target (its name), the device it was measured on, and whether caches were cold: records of two never mix.

    ``device`` is None for records made before devices were kept, whose key is
    the target's name alone. ``digest`` tells apart a key whose target name
    and device were registered before with another TVM target
    (:meth:`probtune.Database.measured_on`).
    """

    target: str
    device: str | None = None
    cold: bool = False
    digest: str | None = None

    def __post_init__(self) -> None:
        if self.digest is not None and (self.device is None or not re.fullmatch(_DIGEST, self.digest)):
            raise ValueError(f"a key's digest is {_DIGEST_LENGTH} hex digits after a device, got {self.digest!r}")

    @property
    def timed_target(self) -> str:
        """The target's name with the timing mode: what the ``measured_on`` table keeps as a key's target."""
        return self.target + COLD_CACHE if self.cold else self.target

    @property
    def text(self) -> str:
        """The key as the database stores it: ``TARGET[+cold-llc]@DEVICE[#DIGEST]`` (the name alone without a device)."""
        if self.device is None:
            return self.timed_target
        return f"{self.timed_target}@{self.device}" + (f"#{self.digest}" if self.digest else "")

    def __str__(self) -> str:
        return self.text

    def with_digest_of(self, tvm_target: str) -> MeasureKey:
        """This key told apart from the same target name and device measured with another TVM target (its JSON)."""
        return replace(self, digest=hashlib.sha256(tvm_target.encode()).hexdigest()[:_DIGEST_LENGTH])

    @classmethod
    def parse(cls, text: str, timed_target: str | None = None) -> MeasureKey:
        """The key whose :attr:`text` is ``text`` (any string: old databases hold keys written before this class).

        The target ends at the first '@' (a device's name may hold more), or
        after ``timed_target`` where the caller knows it (a ``measured_on``
        row's target). A name alone is a key made before devices were kept.
        """
        target, device = _split_target(text, timed_target)
        cold = target.endswith(COLD_CACHE)
        name = target[: -len(COLD_CACHE)] if cold else target
        if device is None:
            return cls(name, None, cold)
        found = _WITH_DIGEST.fullmatch(device)
        return cls(name, found["device"], cold, found["digest"]) if found else cls(name, device, cold)


def _split_target(text: str, timed_target: str | None) -> tuple[str, str | None]:
    """``text``'s timed target, and what follows its '@' (None where nothing does: a name alone)."""
    if timed_target is not None and (text == timed_target or text.startswith(timed_target + "@")):
        return timed_target, None if text == timed_target else text[len(timed_target) + 1:]
    target, at, rest = text.partition("@")
    return target, rest if at else None
