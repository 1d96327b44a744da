#!/bin/bash
# Preview the working tree against the last release of gpufleet: fails (exit 4) when what gpufleet now
# generates would destroy, replace or rename a protected resource of a fleet applied from that release
# without a migration (a `moved` block for an address change). CI runs it in plan.yml's preview job;
# `make preview-release` runs it locally. Extra arguments go to `gpufleet preview` (e.g. --json-out).
#
# The last release: the newest final version tag (vX.Y.Z, no -rc/-beta suffix, which git's version sort
# ranks above the final; no other tag that merely starts with v) reachable from HEAD, in version order;
# with none, the merge base with origin/main; with no origin/main either, an error (exit 2).
set -euo pipefail
GPUFLEET="${GPUFLEET:-gpufleet}"
# awk reads every line (no early exit): git never meets a closed pipe, which pipefail would turn into a silent exit.
base=$(git tag --merged HEAD --list 'v[0-9]*' --sort=-v:refname | awk '/^v[0-9]+(\.[0-9]+)*$/ && !found { print; found = 1 }')
if [ -z "$base" ]; then
  base=$(git merge-base HEAD origin/main 2>/dev/null) || { echo "error: no release tag v* and no origin/main to compare with; tag the last release (git tag v0.1.0 <commit>) or fetch origin/main" >&2; exit 2; }
fi
echo "previewing against the last release: $base" >&2
# gpufleet preview: 0 nothing changes, 3 changes none of them blocked (both pass), 4 blocked, 1/2 errors.
rc=0
"$GPUFLEET" preview --base "$base" "$@" || rc=$?
if [ "$rc" -eq 3 ]; then exit 0; fi
exit "$rc"
