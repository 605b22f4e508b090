"""The ``ags`` command line: parses arguments, calls objstore and agent, prints.

No logic of its own lives here; see app.py for the group, the error boundary
and the table of which module defines each command (a command's module is
imported when the command runs).
"""

from __future__ import annotations

from .app import cli


def main() -> None:
    cli(prog_name="ags")


if __name__ == "__main__":
    main()
