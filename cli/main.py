"""The ``ags`` command line: parses arguments, calls objstore and agent, prints.

No logic of its own lives here; see app.py for the group and the error
boundary, and the command modules for the commands.
"""

from __future__ import annotations

from .app import cli
from .chat import chat  # noqa: F401
from .history import log  # noqa: F401  (importing a command module registers its commands)
from .maintenance import gc  # noqa: F401
from .remotes import remote_cmd  # noqa: F401
from .serve import serve_cmd  # noqa: F401
from .sessions import fork  # noqa: F401
from .sync import push_cmd  # noqa: F401


def main() -> None:
    cli(prog_name="ags")


if __name__ == "__main__":
    main()
