"""Text from a node, made safe to show on a terminal.

A node's output (task logs, the chief's lines, ``exec`` output, error
details) is written by programs we do not control, on machines that may
not be ours. Printed as it is, an escape sequence in it can clear the
screen, rewrite earlier lines, set the window title, plant a hyperlink
whose text lies about its target (OSC 8), or write the clipboard (OSC 52).
``node_text`` keeps what a reader needs (the text, tabs, any ordinary
Unicode) and drops every terminal control. It is the one place that does
this: infra applies it where node lines enter (parsers, stream callbacks),
so every consumer gets clean text.
"""

from __future__ import annotations

import re

# Escape sequences, removed whole (parameters and all), so no "[2J" residue
# is left behind. 7-bit forms start with ESC, 8-bit forms with a C1 byte.
_SEQUENCE = re.compile(
    r"""
    (?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?                # CSI: cursor moves, screen clears, colours
    | (?:\x1b[\]P^_X]|[\x90\x98\x9d\x9e\x9f])        # OSC (titles, OSC 8 links, OSC 52
      [^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?          #   clipboard), DCS, SOS, PM, APC: up to
                                                     #   their terminator, or the line's end
    | \x1b[ -/]*[0-~]?                               # any other ESC sequence (charset, RIS, ...)
    """,
    re.VERBOSE,
)
# What is left of the controls after the sequences: C0 except tab, DEL, C1.
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")


def node_text(line: str) -> str:
    """``line`` without terminal controls: ESC sequences (CSI, OSC, DCS and
    the like, 7- and 8-bit), C0 controls but tab, DEL and C1 controls.
    A carriage return that would overwrite the line so far becomes a space
    (what it hid stays visible); one at the end (CRLF) is dropped."""
    line = _SEQUENCE.sub("", line.rstrip("\r"))
    return _CONTROL.sub(lambda m: " " if m.group() == "\r" else "", line)
