"""Autostop's durations as cluster.yaml and the command line write them
(``45s``, ``30m``, ``1h30m``, ``off``): parsed, checked and shown.

With the config, below everything that uses them: the config checks
``autostop:`` while reading a file, and infra/cluster/autostop.py keeps the nodes
to it.
"""

from __future__ import annotations

import re

# The watcher looks this often; a shorter autostop could not be kept to.
CHECK_EVERY_S = 10
MIN_AUTOSTOP_S = 30

_PART = re.compile(r"(\d+)([smhd])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_OFF = ("off", "none", "false", "no")


class DurationError(ValueError):
    """Not a usable autostop duration; the message says what to write."""


def parse_duration(value: object) -> int | None:
    """Seconds of ``45s``, ``30m``, ``2h``, ``1h30m``; None for off
    (``off``, YAML's false, null). Zero, negative, a bare number or
    anything else is a ``DurationError``."""
    if value is None or value is False:
        return None
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise DurationError(f"{str(value)[:40]!r} is not a duration; write e.g. 45s, 30m or 2h")
    text = str(value).strip().lower()
    if text in _OFF:
        return None
    if isinstance(value, int | float) or text.lstrip("-").replace(".", "", 1).isdigit():
        if text.startswith("-") or float(text) <= 0:
            raise DurationError(
                f"{text[:40]!r}: autostop must be longer than 0; write e.g. 30m, or off"
            )
        raise DurationError(f"{text[:40]!r} has no unit; write e.g. {text[:20]}s or {text[:20]}m")
    if text.startswith("-"):
        raise DurationError(f"{text[:40]!r}: autostop must be longer than 0; write e.g. 30m")
    if not text or _PART.sub("", text) != "":
        raise DurationError(f"{text[:40]!r} is not a duration; write e.g. 45s, 30m or 2h")
    seconds = sum(int(n) * _UNITS[unit] for n, unit in _PART.findall(text))
    if seconds <= 0:
        raise DurationError(
            f"{text[:40]!r}: autostop must be longer than 0; write e.g. 30m, or off"
        )
    if seconds < MIN_AUTOSTOP_S:
        raise DurationError(
            f"{text[:40]!r} is too short: at least {MIN_AUTOSTOP_S}s "
            f"(the watcher looks every {CHECK_EVERY_S} s)"
        )
    return seconds


def format_duration(seconds: int | None) -> str:
    """``30m``, ``1h30m``, ``45s``; ``off`` for None."""
    if seconds is None:
        return "off"
    parts = []
    for unit in ("d", "h", "m", "s"):
        n, seconds = divmod(seconds, _UNITS[unit])
        if n:
            parts.append(f"{n}{unit}")
    return "".join(parts) or "0s"
