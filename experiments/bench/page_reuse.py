"""What touching memory again costs after the process gave it back: the system CPU of the RL loop's phases.

    python -m experiments.bench.page_reuse --gib 2 --delays 0 0.5 1 2 5 10 --json /tmp/page_reuse.json

Each round frees a `gib`-GiB NumPy buffer (malloc'd, so above glibc's mmap threshold: unmapped on free, as XLA's
CPU runtime frees a step's temporaries), waits `delay` seconds, then allocates a new one and writes one value per
4 KiB page; the round's figure is the system CPU seconds (and wall seconds) of that allocate-and-touch. A kernel
hands a freed page to the next fault cheaply; a virtual machine whose balloon device does free page reporting
(virtio-balloon F_REPORTING: the guest kernel reports free 2^order-page blocks to the host, which discards them
after a short delay) backs a reported page again on the host at the next touch. On such a VM the cost of the same
touch then depends on how long the memory lay free, which is the RL loop's pattern: the update's temporaries lie
free while sampling and the reference pass run (~45 s on SmolLM2), so every update's first step backs the part of
its footprint above the reference pass's afresh (docs/training.md, "Allocator"). The record names the CPU, the
transparent-huge-page mode, the balloon's reporting bit and order and GLIBC_TUNABLES next to the figures.
"""
from __future__ import annotations

import argparse
import glob
import os
import resource
import time

import numpy as np

from experiments.bench.common import add_json_arg, cpu_info, print_table, write_json

PAGE = 4096
REPORTING_BIT = 5  # VIRTIO_BALLOON_F_REPORTING in the virtio feature bits


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def vm_memory_info() -> dict:
    """The transparent-huge-page mode, whether a virtio balloon reports free pages and the order it reports at
    (None where the file is absent: no balloon, not Linux), and GLIBC_TUNABLES."""
    thp = _read("/sys/kernel/mm/transparent_hugepage/enabled")
    features = [_read(p) for p in glob.glob("/sys/bus/virtio/drivers/virtio_balloon/virtio*/features")]
    reporting = None
    if features and features[0]:
        reporting = len(features[0]) > REPORTING_BIT and features[0][REPORTING_BIT] == "1"
    order = _read("/sys/module/page_reporting/parameters/page_reporting_order")
    return {"thp": thp, "balloon_free_page_reporting": reporting,
            "page_reporting_order": int(order) if order and order.lstrip("-").isdigit() else None,
            "glibc_tunables": os.environ.get("GLIBC_TUNABLES", "")}


def _touch(n_bytes: int) -> tuple[np.ndarray, float, float]:
    """(buffer, system CPU s, wall s) of allocating n_bytes and writing one byte per page."""
    s0, w0 = resource.getrusage(resource.RUSAGE_SELF).ru_stime, time.perf_counter()
    buf = np.empty(n_bytes, np.uint8)
    buf[::PAGE] = 1
    return buf, resource.getrusage(resource.RUSAGE_SELF).ru_stime - s0, time.perf_counter() - w0


def measure(gib: float, delays) -> list[dict]:
    """One round per delay (after a first, untimed touch): free, sleep `delay` s, allocate and touch again."""
    n = int(gib * 2**30)
    buf, _, _ = _touch(n)
    rows = []
    for delay in delays:
        del buf
        time.sleep(delay)
        buf, sys_s, wall_s = _touch(n)
        rows.append({"delay_s": float(delay), "sys_s": sys_s, "wall_s": wall_s, "sys_s_per_gib": sys_s / gib})
    return rows


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=2.0, help="buffer size, GiB (SmolLM2's update temporaries: ~2.5)")
    ap.add_argument("--delays", type=float, nargs="+", default=[0, 0.5, 1, 2, 5, 10, 0],
                    help="seconds the freed buffer lies free before the next allocation, one round each")
    add_json_arg(ap)
    args = ap.parse_args(argv)
    info = {"cpu": cpu_info(), **vm_memory_info()}
    rows = measure(args.gib, args.delays)
    print(f"{info['cpu']}; THP {info['thp']}; balloon free page reporting {info['balloon_free_page_reporting']} "
          f"(order {info['page_reporting_order']}); GLIBC_TUNABLES={info['glibc_tunables']!r}")
    print_table(["freed for (s)", f"system CPU s to touch {args.gib:g} GiB", "wall s", "system s / GiB"],
                [[r["delay_s"], r["sys_s"], r["wall_s"], r["sys_s_per_gib"]] for r in rows])
    out = {"gib": args.gib, "machine": info, "rounds": rows}
    write_json(args.json, out)
    return out


if __name__ == "__main__":
    main()
