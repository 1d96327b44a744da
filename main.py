"""cdktf entry point (``cdktf synth|diff|deploy``): load every cluster file and synthesize the fleet."""

import os
import sys
from pathlib import Path

import clusters
from clusters.errors import ConfigError
from gpufleet.synth import synthesize


def main() -> int:
    try:
        configs = clusters.load_all()
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"error: {problem}", file=sys.stderr)
        return 2
    synthesize(configs, Path(os.environ.get("CDKTF_OUTDIR", "cdktf.out")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
