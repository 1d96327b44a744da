"""A checkov process that pays for ``import checkov.main`` (~4 s) before it knows what to scan.

``checkov_scan.prestart`` starts it while ``gpufleet check`` validates inputs and synthesizes; once
the stacks are written it sends one JSON line, the argument list the ``checkov`` entry point would
get, and reads checkov's exit code, stdout and stderr exactly as from that entry point.
"""

from __future__ import annotations

import json
import sys
import warnings

from checkov.main import Checkov


def main() -> int | None:
    line = sys.stdin.readline()
    if not line:
        # stdin closed without a request: gpufleet check ended (or died) before scanning.
        return 0
    args = json.loads(line)
    sys.argv[1:] = args
    with warnings.catch_warnings():
        # The same filter as checkov's own console script.
        warnings.simplefilter("ignore", category=SyntaxWarning)
        return Checkov(args).run()


if __name__ == "__main__":
    sys.exit(main())
