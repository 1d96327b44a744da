"""cdktf entry point (``cdktf synth|diff|deploy``): load every cluster file and synthesize the fleet."""

import os
import sys
from pathlib import Path

import clusters
import clusters.repo
from clusters.errors import ConfigError, UserError
from clusters.termination import EXIT_TERMINATED, Terminated, sigterm_unwinds
from stacks.synth import synthesize


def main() -> int:
    try:
        with sigterm_unwinds():  # cdktf stopped (Ctrl-C, SIGTERM): clean up as `gpufleet synth` does
            clusters_dir = Path(os.environ.get("GPUFLEET_CLUSTERS_DIR") or clusters.repo.clusters_dir())
            synthesize(clusters.load_all(clusters_dir), Path(os.environ.get("CDKTF_OUTDIR", "cdktf.out")))
    except Terminated:
        print("terminated", file=sys.stderr)
        return EXIT_TERMINATED
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"error: {problem}", file=sys.stderr)
        return 2
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
