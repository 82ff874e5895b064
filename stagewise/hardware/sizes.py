"""Byte-size parsing and printing: ``24GiB``, ``22.76GB``, ``512MiB``, ``1073741824``.

Sizes are converted to integer bytes once, at the edge; nothing downstream reads strings.
"""

from __future__ import annotations

import re

from stagewise.errors import TopologyError

_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
}
MAX_DEVICE_BYTES = 1 << 50  # 1 PiB: anything larger is a typo, not a device
_SIZE = re.compile(r"^\s*(-?[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: str, field: str = "size") -> int:
    """Parse ``text`` (a number with an optional SI or binary unit) into bytes.

    Raises :class:`TopologyError` naming ``field`` for malformed, negative or absurd sizes
    (over 1 PiB).
    """
    match = _SIZE.match(str(text))
    if not match:
        raise TopologyError(f"{field}: cannot read size {text!r} (examples: 24GiB, 22.76GB, 512MiB)")
    number, unit = match.groups()
    scale = _UNITS.get(unit.lower())
    if scale is None:
        raise TopologyError(f"{field}: unknown unit {unit!r} in {text!r} (use B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)")
    if number.startswith("-"):
        raise TopologyError(f"{field}: a size must not be negative, got {text!r}")
    return checked_bytes(float(number) * scale, field)


def checked_bytes(value: float | int, field: str) -> int:
    """Return ``value`` as int bytes; reject negatives, NaN and sizes over 1 PiB naming ``field``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TopologyError(f"{field}: expected a number of bytes, got {value!r}")
    if value != value or value < 0:  # NaN or negative
        raise TopologyError(f"{field}: size must be >= 0 bytes, got {value!r}")
    if value > MAX_DEVICE_BYTES:
        raise TopologyError(f"{field}: size {value!r} bytes is absurd (over 1 PiB)")
    return int(value)


def format_bytes(value: int | float, binary: bool = False) -> str:
    """Human form in decimal GB/MB (the RFC's unit), e.g. ``22.760 GB``; ``binary``: GiB/MiB/KiB
    (``24.000 GiB``), for sizes the user gave in binary units."""
    v = float(value)
    sign = "-" if v < 0 else ""
    v = abs(v)
    if binary:
        for unit, scale, digits in (("GiB", 1 << 30, 3), ("MiB", 1 << 20, 1), ("KiB", 1 << 10, 1)):
            if v >= scale:
                return f"{sign}{v / scale:.{digits}f} {unit}"
        return f"{sign}{v:.0f} B"
    if v >= 1e9:
        return f"{sign}{v / 1e9:.3f} GB"
    if v >= 1e6:
        return f"{sign}{v / 1e6:.1f} MB"
    if v >= 1e3:
        return f"{sign}{v / 1e3:.1f} KB"
    return f"{sign}{v:.0f} B"


_PRINTED = re.compile(r"(?<![\w.])(-?[0-9]+(?:\.[0-9]+)?) (GB|MB|KB)\b")


def in_binary_units(text: str) -> str:
    """``text`` with every size :func:`format_bytes` printed in decimal units (``25.770 GB``) printed in
    binary ones (``24.000 GiB``), to the same precision: a certificate's reasons, shown to a user who
    gave sizes in GiB."""
    return _PRINTED.sub(lambda m: format_bytes(float(m.group(1)) * _UNITS[m.group(2).lower()], binary=True), text)


def uses_binary_units(spec: str | None) -> bool:
    """Whether a ``--devices`` spec gives its sizes in binary units (``24GiB,12GiB``)."""
    return bool(spec) and re.search(r"[0-9.]\s*[kmgt]ib", str(spec).lower()) is not None
