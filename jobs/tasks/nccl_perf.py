"""Two-node NCCL bandwidth test run as a gpufleet training pod (jobs/nccl-test-<family>.yaml, docs/large-runs.md).

Why not upstream's ``all_gather_perf`` binary itself: NVIDIA's nccl-tests span nodes only through MPI,
and Google's runs launch it over sshd as root in a privileged container (cluster-toolkit
examples/gke-consumption-options/dws-flex-start/nccl-jobset-example.yaml: ``privileged: true``,
``OMPI_ALLOW_RUN_AS_ROOT``, ``/scripts/container_entry.sh daemon``), which the tenant privilege policy
refuses by design. Run that way it would also prove nothing about the question that matters here:
whether a training container as gpufleet renders it (uid 1000, upstream's capabilities only, the
platform's NCCL environment) gets GPUDirect or silently falls back to TCP on eth0. So this runs the
same collectives with the same sweep (``-b``/``-e``/``-f 2``, ``-w 5``, ``--iters``) through
torch.distributed's NCCL backend under torchrun, inside the rendered pod, and reports nccl-tests'
own figures: ``algbw = size / time`` and ``busbw`` by nccl-tests doc/PERFORMANCE.md (all_gather
``(n-1)/n``, all_reduce ``2(n-1)/n``), ``size`` being the whole output buffer as nccl-tests prints it.

Rank 0 prints an nccl-tests style table, the memlock limit it ran under and the network NCCL chose
(its ``Using network`` INFO line), and exits 5 when the all_gather bus bandwidth at the largest size is
below ``--min-busbw-gbps``: a fallback to eth0 cannot reach upstream's figure. Exit 3: a required key
did not arrive from Vault (it is never printed). Only the pure helpers below are tested off the
hardware; the collectives need the GPUs, and nobody has run this file on them from this repository.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
# nccl-tests doc/PERFORMANCE.md, "Bus bandwidth": the factor from algbw to busbw for n ranks.
BUS_FACTOR = {"all_gather": lambda n: (n - 1) / n, "all_reduce": lambda n: 2 * (n - 1) / n}
NETWORK_LINE = re.compile(r"NCCL INFO Using network (\S+)")
EXIT_KEY_MISSING = 3
EXIT_BELOW_MINIMUM = 5


def parse_size(text: str) -> int:
    """nccl-tests' size syntax (``-b 1M -e 8G``): a count of bytes with an optional K/M/G (powers of 2)."""
    match = re.fullmatch(r"(\d+)([KMG]?)", text.strip().upper())
    if match is None:
        raise ValueError(f"{text!r} is not a size; write bytes with an optional K, M or G, e.g. 1M or 8G")
    return int(match.group(1)) * UNITS[match.group(2)]


def sweep(min_bytes: int, max_bytes: int, factor: int = 2) -> tuple[int, ...]:
    """The sizes nccl-tests runs for ``-b min -e max -f factor``."""
    sizes, size = [], min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size *= factor
    return tuple(sizes)


@dataclass(frozen=True)
class Row:
    collective: str
    size_bytes: int
    seconds: float
    ranks: int

    @property
    def algbw_gbps(self) -> float:
        return self.size_bytes / self.seconds / 1e9

    @property
    def busbw_gbps(self) -> float:
        return self.algbw_gbps * BUS_FACTOR[self.collective](self.ranks)


def format_row(row: Row) -> str:
    return f"{row.collective:>10} {row.size_bytes:>12} {row.seconds * 1e6:>10.1f} {row.algbw_gbps:>8.2f} {row.busbw_gbps:>8.2f}"


def verdict(rows: list[Row], min_busbw_gbps: float) -> tuple[bool, str]:
    """Pass when all_gather's bus bandwidth at the largest size reaches the minimum (upstream prints
    its figures for that collective at that size)."""
    gathers = [r for r in rows if r.collective == "all_gather"]
    if not gathers:
        return False, "no all_gather result; the run did not measure what the minimum is about"
    last = max(gathers, key=lambda r: r.size_bytes)
    if last.busbw_gbps < min_busbw_gbps:
        return False, (f"all_gather busbw {last.busbw_gbps:.2f} GB/s at {last.size_bytes} B is below the minimum {min_busbw_gbps:g} GB/s:"
                       " NCCL is not using the GPUDirect NICs (see the network line above) or a node is unhealthy")
    return True, f"all_gather busbw {last.busbw_gbps:.2f} GB/s at {last.size_bytes} B reaches the minimum {min_busbw_gbps:g} GB/s"


def network_from_log(text: str) -> str | None:
    """The network NCCL chose (``NCCL INFO Using network <name>``; ``Socket`` is the TCP fallback)."""
    found = NETWORK_LINE.findall(text)
    return found[-1] if found else None


def memlock_limit() -> str:
    """RLIMIT_MEMLOCK of this process, as ``ulimit -l`` reports it (KiB or unlimited): what bounds pinning
    for a non-root process whatever capabilities the pod adds (docs/large-runs.md)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return "unlimited" if soft == resource.RLIM_INFINITY else str(soft // 1024)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--collectives", default="all_gather,all_reduce")
    parser.add_argument("--min-bytes", type=parse_size, default=parse_size("1M"))
    parser.add_argument("--max-bytes", type=parse_size, default=parse_size("8G"))
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--min-busbw-gbps", type=float, required=True)
    parser.add_argument("--require-env", action="append", default=[], help="a variable that must have arrived from Vault")
    args = parser.parse_args(argv)
    unknown = set(args.collectives.split(",")) - set(BUS_FACTOR)
    if unknown:
        parser.error(f"unknown collective(s) {sorted(unknown)}; allowed: {sorted(BUS_FACTOR)}")
    return args


def _measure(collective: str, size_bytes: int, warmup: int, iters: int) -> Row:
    import torch
    import torch.distributed as dist

    ranks = dist.get_world_size()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    elements = max(1, size_bytes // 4 // ranks) * ranks
    out = torch.empty(elements, dtype=torch.float32, device=device)
    if collective == "all_gather":
        src = torch.ones(elements // ranks, dtype=torch.float32, device=device)
        step = lambda: dist.all_gather_into_tensor(out, src)  # noqa: E731
    else:
        step = lambda: dist.all_reduce(out)  # noqa: E731
    for _ in range(warmup):
        step()
    torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        step()
    end.record()
    torch.cuda.synchronize(device)
    seconds = torch.tensor([start.elapsed_time(end) / 1000 / iters], device=device)
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
    return Row(collective, elements * 4, float(seconds.item()), ranks)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    missing = [name for name in args.require_env if not os.environ.get(name)]
    if missing:
        print(f"missing from Vault: {', '.join(missing)}", file=sys.stderr)
        return EXIT_KEY_MISSING
    debug_file = f"/tmp/nccl-debug.{socket.gethostname()}.{os.getpid()}"
    os.environ.setdefault("NCCL_DEBUG", "INFO")
    os.environ.setdefault("NCCL_DEBUG_SUBSYS", "INIT,NET")
    os.environ.setdefault("NCCL_DEBUG_FILE", debug_file)
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    rows = [_measure(c, size, args.warmup, args.iters) for c in args.collectives.split(",") for size in sweep(args.min_bytes, args.max_bytes)]
    rank = dist.get_rank()
    dist.destroy_process_group()
    if rank != 0:
        return 0
    log = Path(debug_file)
    print(f"# memlock (ulimit -l): {memlock_limit()}  network: {network_from_log(log.read_text()) if log.exists() else 'unknown'}")
    print(f"# {'collective':>8} {'size(B)':>12} {'time(us)':>10} {'algbw':>8} {'busbw':>8}  (GB/s, nccl-tests definitions)")
    for row in rows:
        print(format_row(row))
    ok, message = verdict(rows, args.min_busbw_gbps)
    print(("PASS: " if ok else "FAIL: ") + message)
    return 0 if ok else EXIT_BELOW_MINIMUM


if __name__ == "__main__":
    raise SystemExit(main())
