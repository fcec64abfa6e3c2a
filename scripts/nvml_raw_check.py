"""On a machine with an NVIDIA GPU: the nvml receiver's own ctypes calls beside pynvml's wrappers.

    python scripts/nvml_raw_check.py [--gpu 0] [--since-s 2]

Prints, for one GPU, the running compute processes and the per-process utilisation entries since
``--since-s`` seconds ago, as pynvml answers and as ``receivers/nvml/_raw.py`` answers, and exits 1 if
they differ. Run it while a few processes use the GPU (docs/hardware.md). Needs no wattpipe pipeline.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pynvml

from wattpipe.receivers.nvml._raw import ProcessList, UtilisationSamples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--since-s", type=float, default=2.0)
    args = parser.parse_args()
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(args.gpu)
        wrapped = sorted(
            (int(p.pid), p.usedGpuMemory, int(p.gpuInstanceId), int(p.computeInstanceId))
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        )
        raw = sorted(ProcessList()(handle))
        since_us = int((time.time() - args.since_s) * 1e6)
        try:
            wrapped_util = sorted(
                (int(s.pid), int(s.timeStamp), float(s.smUtil))
                for s in pynvml.nvmlDeviceGetProcessUtilization(handle, since_us)
            )
        except pynvml.NVMLError as exc:
            wrapped_util = [repr(exc)]  # type: ignore[list-item]
        try:
            raw_util = sorted(UtilisationSamples()(handle, since_us))
        except pynvml.NVMLError as exc:
            raw_util = [repr(exc)]  # type: ignore[list-item]
    finally:
        pynvml.nvmlShutdown()
    print(f"processes, pynvml: {wrapped}\nprocesses, raw:    {raw}")
    print(f"utilisation, pynvml: {wrapped_util}\nutilisation, raw:    {raw_util}")
    # The two utilisation calls are made a moment apart: entries may differ by a sample; the shapes may not.
    same = wrapped == raw and len(wrapped_util) == len(raw_util)
    print("same" if same else "DIFFERENT")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
