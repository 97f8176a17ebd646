"""Error types and the one-line message format.

`InputError` is an *expected* failure caused by the user's input or flags: the CLI prints
one line (what, where, hint) and exits 2. Anything else that escapes a command is a runtime
failure: exit 1. Tool faults (network, judge) are never raised to the CLI; they are retried
and recorded in the table (see `atomcli.retry`).
"""

from __future__ import annotations


class InputError(Exception):
    """Bad usage or bad input. Exit code 2, one line, no partial output."""

    def __init__(self, what: str, *, file: str | None = None, row: int | None = None,
                 column: str | None = None, hint: str | None = None):
        self.what, self.file, self.row, self.column, self.hint = what, file, row, column, hint
        super().__init__(self.one_line())

    def one_line(self) -> str:
        where = []
        if self.file is not None:
            where.append(str(self.file))
        if self.row is not None:
            where.append(f"row {self.row}")
        if self.column is not None:
            where.append(f"column `{self.column}`")
        msg = (", ".join(where) + ": " if where else "") + self.what
        if self.hint:
            msg += f" (hint: {self.hint})"
        return msg.replace("\n", " ")

    def located(self, file: str | None = None, row: int | None = None) -> "InputError":
        """Return a copy that also names the file (and row) where it happened.

        A stage that never sees paths names its input `-`; the caller's real name replaces it."""
        # the same class: a caller may catch a subclass (run-all's rft rounds catch rft.NothingKept)
        return type(self)(self.what, file=self.file if self.file not in (None, "-") else file,
                          row=self.row if self.row is not None else row,
                          column=self.column, hint=self.hint)


def unknown_choice(kind: str, name: str, valid) -> InputError:
    """The error for an unknown plugin/option name, listing the valid ones."""
    return InputError(f"unknown {kind} `{name}`", hint="valid: " + ", ".join(sorted(valid)))
