"""Plain-text tables for the command line: pure string formatting, no I/O.

Names printed in a table (groups, topics, owners, error messages) come from
whoever wrote the store or Kafka, so every cell that carries one goes through
:func:`printable` first.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence


def printable(text: str) -> str:
    """``text`` with control and other non-printable characters escaped (\\x1b, \\n, ...).

    Group, topic and owner names come from whoever wrote the store or Kafka:
    printed as they are, they could move the cursor, recolour or rewrite the
    operator's terminal.
    """
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def format_table(
    header: Sequence[str], rows: Sequence[Sequence[str]], right_aligned: Collection[str] = frozenset()
) -> str:
    """``header`` and ``rows`` as aligned columns two spaces apart; columns named in ``right_aligned`` flush right.

    Cells are printed as given: escape untrusted text with :func:`printable` first.
    """
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        parts = [
            c.rjust(w) if h in right_aligned else c.ljust(w) for c, w, h in zip(cells, widths, header, strict=True)
        ]
        return "  ".join(parts).rstrip()

    return "\n".join(line(r) for r in [header, *rows])
