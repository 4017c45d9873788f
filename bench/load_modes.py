"""What reading an artifact privately costs beside mapping it (Note [Mapped or private] in
bladepack/artifact/format.py): `read(path, map_file=True|False)`, with and without section checksums,
on a synthetic artifact of one weight section, side by side in one process; medians of 5.

    python -m bench.load_modes [--mib 256]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from bladepack.artifact import format as bpk_format


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=256)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "big.bpk")
        bpk_format.write(path, {"bench": 1}, [bpk_format.Section("weight/w", os.urandom(1 << 20) * args.mib)])
        print(f"| {args.mib} MiB artifact | mapped | private | private / mapped |")
        print("| --- | --- | --- | --- |")
        for verify in (True, False):
            times = {}
            for map_file in (True, False):
                runs = []
                for _ in range(5):
                    start = time.perf_counter()
                    bpk = bpk_format.read(path, verify=verify, map_file=map_file)
                    bytes(bpk.section("weight/w")[-1:])  # touch the end, as a first call would
                    runs.append(time.perf_counter() - start)
                    del bpk
                times[map_file] = statistics.median(runs)
            what = "checksums checked" if verify else "checksums skipped"
            ratio = times[False] / times[True]
            print(f"| {what} | {times[True] * 1e3:.0f} ms | {times[False] * 1e3:.0f} ms | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
