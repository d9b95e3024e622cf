"""Figures in one notation, for every command and report that prints one: engineering notation with the unit.

Three significant digits and a prefix: binary prefixes for bytes (``3.60 GiB/s``, ``4 KiB``), SI prefixes no
larger than the second for times (``24.3 µs``, ``1.50 ms``), SI prefixes from k up, set apart, for any other
unit (``8.63 k ops/s``, ``0.278 calls/s``). A range takes one prefix (``8.63-17.1 k ops/s``) and bounds that
print alike are one value. Pure functions, no import of the rest of svcframe: the command line re-exports
them (``svcframe.cli.common``) and modules below it use them directly.
"""

from __future__ import annotations

import math

_SI_PREFIXES = {-4: "p", -3: "n", -2: "µ", -1: "m", 0: "", 1: "k", 2: "M", 3: "G", 4: "T", 5: "P", 6: "E"}
_BINARY_PREFIXES = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")
#: Units that are bytes (scaled to bytes, printed with binary prefixes) and seconds (SI prefixes, never above s).
_BYTE_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
_SECOND_UNITS = {"s": 1.0, "ms": 1e-3, "msec": 1e-3, "µs": 1e-6, "us": 1e-6, "usec": 1e-6, "ns": 1e-9}


def _scale(value: float, unit: str) -> tuple[float, int, int, str, str, bool]:
    """``value`` in ``unit`` as (value in the base unit, step, lowest exponent, base, tail, attach): bytes step
    1024 and never below B; seconds step 1000 and never above s; other units step 1000, never below 1 (a rate
    of 0.278 calls/s, not 278 m), with the prefix set apart (``k ops/s``)."""
    head, slash, tail = unit.partition("/")
    tail = slash + tail
    if head in _BYTE_UNITS:
        return value * _BYTE_UNITS[head], 1024, 0, "B", tail, True
    if head in _SECOND_UNITS:
        return value * _SECOND_UNITS[head], 1000, -4, "s", tail, True
    return value, 1000, 0, head, tail, False


def _exponent(magnitude: float, step: int, lowest: int, highest: int) -> int:
    """The prefix exponent that puts ``magnitude`` in [1, 1000) (binary: [1, 1000) of 1024s), within range."""
    if magnitude == 0:
        return 0
    e = math.floor(math.log(magnitude, step)) if step == 1000 else 0
    if step == 1024:
        while magnitude / step ** (e + 1) >= 1 and e < highest:
            e += 1
    e = max(lowest, min(highest, e))
    while e < highest and abs(float(f"{magnitude / step**e:.3g}")) >= 1000:
        e += 1  # 999.7 k rounds to 1000 k: 1.00 M
    return e


def _mantissa(m: float, digits: int = 3) -> str:
    # 8.632 -> "8.63", 17.09 -> "17.1", 3.6 -> "3.60", 0.9997 -> "1.00", 512.0 -> "512", 4.0 -> "4" (exact stays exact)
    if m == round(m) and abs(m) < 10**digits:
        return f"{round(m):d}"
    m = float(f"{m:.{digits}g}")
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(m))))
    return f"{m:.{decimals}f}"


def _prefixed(base: str, tail: str, attach: bool, step: int, e: int) -> str:
    prefix = _BINARY_PREFIXES[e] if step == 1024 else _SI_PREFIXES[e]
    if attach or not prefix:
        return f"{prefix}{base}{tail}"
    return f"{prefix} {base}{tail}".rstrip()


def quantity(value: float | None, unit: str = "", digits: int = 3, *, keep_unit: bool = False) -> str:
    """A figure in engineering notation with its unit: three significant digits and a prefix.

    Bytes (a unit ``B``, ``KiB``... ``GiB``, alone or per something: ``GiB/s``) take binary prefixes; seconds
    (``s``, ``ms``, ``µs``, ``usec``...) SI prefixes no larger than the second; any other unit SI prefixes from
    k up, set apart from it. An exact whole mantissa prints without decimals (a size: ``4 KiB``).

    With ``keep_unit`` the figure stays in ``unit``, with three significant digits and no prefix of its own
    (``quantity(0.434, "GiB/s", keep_unit=True)`` is ``"0.434 GiB/s"``): for a quantity every table, plot and
    document shows in one unit.

    Examples: ``quantity(8632, "ops/s")`` is ``"8.63 k ops/s"``, ``quantity(3.6, "GiB/s")`` ``"3.60 GiB/s"``,
    ``quantity(24.3, "usec")`` ``"24.3 µs"``, ``quantity(4096, "B")`` ``"4 KiB"``, None ``"-"``.
    """
    if value is None:
        return "-"
    if not math.isfinite(value):
        return f"{value} {unit}".rstrip()
    if keep_unit:
        return f"{_mantissa(float(value), digits)} {unit}".rstrip()
    base_value, step, lowest, base, tail, attach = _scale(float(value), unit)
    highest = 0 if base == "s" else (len(_BINARY_PREFIXES) - 1 if step == 1024 else 6)
    e = _exponent(abs(base_value), step, lowest, highest)
    return f"{_mantissa(base_value / step**e, digits)} {_prefixed(base, tail, attach, step, e)}".rstrip()


def quantity_range(
    low: float | None, high: float | None, unit: str = "", digits: int = 3, *, keep_unit: bool = False
) -> str:
    """A min-max range in one prefix, the larger bound's: ``quantity_range(8632, 17090, "ops/s")`` is
    ``"8.63-17.1 k ops/s"``; bounds that print alike are one value (a single repeat: ``"8.56 k ops/s"``).
    ``keep_unit``: both bounds in ``unit`` itself (``"0.434-0.447 GiB/s"``, see :func:`quantity`)."""
    if low is None or high is None:
        return quantity(low if high is None else high, unit, digits, keep_unit=keep_unit)
    lo_text, hi_text = (
        quantity(low, unit, digits, keep_unit=keep_unit),
        quantity(high, unit, digits, keep_unit=keep_unit),
    )
    if lo_text == hi_text or not (math.isfinite(low) and math.isfinite(high)):
        return hi_text
    if keep_unit:
        return f"{_mantissa(float(low), digits)}-{hi_text}"
    lo_base, step, lowest, base, tail, attach = _scale(float(low), unit)
    hi_base = _scale(float(high), unit)[0]
    highest = 0 if base == "s" else (len(_BINARY_PREFIXES) - 1 if step == 1024 else 6)
    e = _exponent(max(abs(lo_base), abs(hi_base)), step, lowest, highest)
    lo_m, hi_m = _mantissa(lo_base / step**e, digits), _mantissa(hi_base / step**e, digits)
    return f"{lo_m}-{hi_m} {_prefixed(base, tail, attach, step, e)}".rstrip()


def percent(fraction: float | None) -> str:
    """``0.723`` -> ``"72%"``; None -> ``"-"``."""
    return "-" if fraction is None else f"{100 * fraction:.0f}%"
