"""Text for one-line messages: a reply or a name found in Redis, shown on one line.

No Temporal and no Redis import, so workflow code may use it.
"""

from __future__ import annotations

MAX_DETAIL_CHARS = 300
"""Longest detail (a server's reply, a validation message) one line carries."""

MAX_NAME_CHARS = 80
"""Most characters of a name ``show_name`` shows; a longer one is cut (``...``) with its length."""

_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def one_line(text: str, limit: int = MAX_DETAIL_CHARS) -> str:
    """``text`` on one line (line breaks become ``; ``), cut at ``limit`` characters."""
    flat = "; ".join(part.strip() for part in str(text).splitlines() if part.strip())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _escaped(char: str) -> str:
    if char in _ESCAPES:
        return _ESCAPES[char]
    if char == " " or (char.isprintable() and not char.isspace()):
        return char
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _plain(name: str) -> bool:
    return all(c.isprintable() and not c.isspace() and c not in "\\\"'`" for c in name)


def show_name(name: str, limit: int = MAX_NAME_CHARS) -> str:
    r"""A name found in Redis (a consumer group, a consumer, a claim's owner) as one line of text.

    Redis accepts any bytes as a group's or a consumer's name: empty, blanks, braces, line breaks,
    control characters. Shown as it is when it has 1 to ``limit`` characters, all printable, none a
    blank, a quote, a backquote or a backslash (``xmc-workers``, ``grp{1}``, ``ümlaut``); otherwise
    between double quotes with backslash escapes (``"audit team"``, ``"dead\nline"``, ``""``):
    ``\n``, ``\r``, ``\t``, ``\"``, ``\\``, and ``\xNN``, ``\uNNNN`` for any other blank or
    unprintable character (bidirectional controls included). An escaped text longer than ``limit``
    characters is cut: ``"xxx..." (N characters)``, N the name's length. So the text holds no line
    break and at most ``limit`` + 30 characters. JSON output carries the name itself, unescaped.
    """
    name = str(name)
    if name and len(name) <= limit and _plain(name):
        return name
    shown: list[str] = []
    used = 0
    for char in name:
        escaped = _escaped(char)
        if used + len(escaped) > limit:
            return '"' + "".join(shown) + f'..." ({len(name)} characters)'
        shown.append(escaped)
        used += len(escaped)
    return '"' + "".join(shown) + '"'


def script_reply(reply: str) -> str:
    r"""A script's error reply on one line: its control characters escaped (``\xNN``, ``\uNNNN``).

    Redis turns the line breaks of an error reply into blanks, but passes the other characters
    ``str.splitlines`` breaks at (``\x0b``, ``\x1c``, U+2028, ...), and a script quoting a value it found
    (Lua's ``%q``) leaves them as they are.
    """
    return "".join(_escaped(c) if c != " " and (c in _BREAKS or not c.isprintable()) else c for c in reply)


_BREAKS = frozenset("\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")
