"""One full pass of a memory-bound kernel over a tensor: the unit the loss (cross_entropy.py) and
the eager elementwise ops (elementwise.py) are priced in, bytes read and written per element."""

from __future__ import annotations

from dataclasses import dataclass

FP32_BYTES = 4


@dataclass(frozen=True)
class Pass:
    """One full pass over a tensor of ``width`` elements per token (elementwise.py: h, q, kv or
    f; cross_entropy.py: the logit): bytes per element read and written."""

    name: str
    width: str
    read_bytes: float
    write_bytes: float

    @property
    def bytes(self) -> float:
        return self.read_bytes + self.write_bytes


def casts(eb: int) -> bool:
    """Whether ``.float()`` / ``type_as`` copy (a 2-byte tensor) or return the tensor itself (fp32)."""
    return eb < FP32_BYTES


def total_bytes(passes: list[Pass]) -> float:
    """Bytes per element the passes move together."""
    return sum(p.bytes for p in passes)
