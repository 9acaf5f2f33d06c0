"""Quantities with units: every bandwidth, size and time in a spec carries its unit.

Conventions (DESIGN §8): bits/s end in ``_bps``, bytes/s in ``_Bps``, bytes in ``_bytes``,
seconds in ``_s``.  Decimal prefixes for GB, MB, Gbit; binary for GiB, MiB.
"""

from __future__ import annotations

import math
import re
import sys

_NUMBER = r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|NaN|inf|Inf)"
_PATTERN = re.compile(rf"^\s*{_NUMBER}\s*([A-Za-zµ/]+)\s*$")

# unit -> bytes per second
BANDWIDTH_UNITS_BPS = {
    "bit/s": 1 / 8, "bps": 1 / 8,
    "kbit/s": 1e3 / 8, "kbps": 1e3 / 8,
    "mbit/s": 1e6 / 8, "mbps": 1e6 / 8,
    "gbit/s": 1e9 / 8, "gbps": 1e9 / 8,
    "tbit/s": 1e12 / 8, "tbps": 1e12 / 8,
    "b/s": 1.0, "kb/s": 1e3, "mb/s": 1e6, "gb/s": 1e9, "tb/s": 1e12,
    "kib/s": 2**10, "mib/s": 2**20, "gib/s": 2**30,
}
# Case matters for B (byte) vs b (bit) in the short forms; we accept the spellings below.
_BANDWIDTH_SPELLINGS = {
    "bit/s": "bit/s", "bps": "bps", "Kbit/s": "kbit/s", "kbit/s": "kbit/s", "Kbps": "kbps", "kbps": "kbps",
    "Mbit/s": "mbit/s", "Mbps": "mbps", "Gbit/s": "gbit/s", "Gbps": "gbps", "Tbit/s": "tbit/s", "Tbps": "tbps",
    "B/s": "b/s", "KB/s": "kb/s", "kB/s": "kb/s", "MB/s": "mb/s", "GB/s": "gb/s", "TB/s": "tb/s",
    "KiB/s": "kib/s", "MiB/s": "mib/s", "GiB/s": "gib/s",
}
SIZE_UNITS_BYTES = {
    "B": 1, "KB": 1e3, "kB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
    "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40,
}
TIME_UNITS_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0}


class UnitError(ValueError):
    """A quantity that cannot be read; the message lists what would be valid."""


def _split(text: object, kind: str, accepted: list[str]) -> tuple[float, str]:
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        raise UnitError(f"expected a {kind} with a unit such as '{accepted[0]}', got {text!r}")
    if isinstance(text, (int, float)):
        raise UnitError(
            f"a bare number ({text}) needs a unit; accepted {kind} units: {', '.join(accepted)}"
        )
    m = _PATTERN.match(text)
    if not m:
        raise UnitError(f"cannot read {text!r} as a {kind}; write a number and a unit, one of: "
                        f"{', '.join(accepted)}")
    value = float(m.group(1))
    if math.isnan(value) or math.isinf(value):
        raise UnitError(f"{text!r} is not a finite number")
    return value, m.group(2)


def _scaled(value: float, scale: float, text: object, kind: str) -> float:
    """``value`` in base units; a finite number can overflow there ('1e300 GB' is 1e309 bytes,
    infinite as a float), and an infinite capacity crashed the search (found by
    scripts/fuzz_plans.py)."""
    out = value * scale
    if not math.isfinite(out):
        raise UnitError(f"{text!r} is too large to be a {kind} (over {sys.float_info.max:.3g} in base units)")
    return out


def _positive(value: float, text: str, kind: str) -> float:
    if value <= 0:
        raise UnitError(f"{kind} must be positive, got {text!r}")
    return value


def parse_bandwidth_Bps(text: object) -> float:
    """'10 Gbit/s' -> 1.25e9 bytes/s."""
    accepted = list(_BANDWIDTH_SPELLINGS)
    value, unit = _split(text, "bandwidth", accepted)
    key = _BANDWIDTH_SPELLINGS.get(unit)
    if key is None:
        raise UnitError(f"unknown bandwidth unit {unit!r}; accepted: {', '.join(accepted)}")
    return _positive(_scaled(value, BANDWIDTH_UNITS_BPS[key], text, "bandwidth"), str(text), "bandwidth")


def parse_size_bytes(text: object) -> float:
    """'80 GB' -> 8e10 bytes; '96 GiB' -> 96 * 2**30."""
    accepted = list(SIZE_UNITS_BYTES)
    value, unit = _split(text, "size", accepted)
    if unit not in SIZE_UNITS_BYTES:
        raise UnitError(f"unknown size unit {unit!r}; accepted: {', '.join(accepted)}")
    return _positive(_scaled(value, SIZE_UNITS_BYTES[unit], text, "size"), str(text), "size")


def parse_time_s(text: object, allow_zero: bool = True) -> float:
    """'30 ms' -> 0.03 s.  Latencies may be zero."""
    accepted = list(TIME_UNITS_S)
    value, unit = _split(text, "time", accepted)
    if unit not in TIME_UNITS_S:
        raise UnitError(f"unknown time unit {unit!r}; accepted: {', '.join(accepted)}")
    if value < 0 or (value == 0 and not allow_zero):
        raise UnitError(f"time must be {'non-negative' if allow_zero else 'positive'}, got {text!r}")
    return _scaled(value, TIME_UNITS_S[unit], text, "time")


def format_bandwidth(Bps: float) -> str:
    bits = Bps * 8
    if bits >= 1e12:
        return f"{bits / 1e12:.3g} Tbit/s"
    if bits >= 1e9:
        return f"{bits / 1e9:.3g} Gbit/s"
    return f"{bits / 1e6:.3g} Mbit/s"


def format_bytes(n: float) -> str:
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"
