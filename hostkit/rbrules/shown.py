"""How a name is shown to a person (issue 44 R8): escaped, never raw.

A file name is bytes its owner chose: ESC, BEL, a newline, a carriage return, a lone byte that is
not UTF-8, a bidirectional override. Written raw to a terminal, a log or a file a person reads,
such a name moves the cursor, rewrites the line above or prints a line that looks like the
runbook's own (a fake `disk: all fine` in a plan). Every name shown (the plan's screen and
changes.txt, run.log, the summary, report.html, a refusal that names a path) goes through `shown`
first, the way `ls -b` and Python's repr show one: what is printable stays as it is (UTF-8 letters
included), a backslash is doubled, and the rest is written as an escape (\\n, \\t, \\r, \\x1b,
\\u202e; a byte that is not UTF-8, as decoded with surrogateescape, as \\xNN). Files read by
programs (plan.json, manifests, names lists) keep names exact.

`printable` is the same escape for a whole line of text that may hold names shown already (a
backslash kept as it is): the last guard where text reaches a person.
"""

from __future__ import annotations

from typing import Union


def _escape(text: str, backslash: bool) -> str:
    out = []
    for ch in text:
        if ch == "\\":
            out.append("\\\\" if backslash else ch)
        elif ch.isprintable():
            out.append(ch)
        elif "\udc80" <= ch <= "\udcff":  # a byte that is not UTF-8 (surrogateescape)
            out.append("\\x%02x" % (ord(ch) - 0xDC00))
        else:
            out.append(repr(ch)[1:-1])  # \n \t \r \x1b \x9b \u202e \U000e0001
    return "".join(out)


def shown(name: Union[str, bytes]) -> str:
    """`name` (a path, or bytes as the file system holds them) as it is shown to a person: every
    character that is not printable, and every byte that is not UTF-8, escaped as `ls -b` or
    repr would; a backslash doubled, so the escape is never ambiguous."""
    if isinstance(name, bytes):
        name = name.decode("utf-8", "surrogateescape")
    if name.isprintable() and "\\" not in name:
        return name
    return _escape(name, True)


def printable(text: str) -> str:
    """A line of text for a terminal or a file a person reads: what `shown` escapes, escaped; a
    backslash kept (the line may hold names `shown` escaped already)."""
    if text.isprintable():
        return text
    return _escape(text, False)
