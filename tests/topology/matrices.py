"""Hand-written topologies for the tests: the KEP-690 8 × V100 matrix as printed in the KEP, and helpers."""

from __future__ import annotations

from wattpipe.pipeline.topology import GpuTopology, Link

# KEP-690's `nvidia-smi topo -m` of an 8 × V100 hybrid cube mesh (NVLinks only; the PCIe path comes
# from sockets: GPUs 0–3 on socket 0, 4–7 on socket 1, pairs {0,1}, {2,3}, {4,5}, {6,7} behind one switch).
KEP_MATRIX = """
NV1 NV1 NV2 NV2 SYS SYS SYS
NV2 NV1 SYS NV2 SYS SYS
NV2 SYS SYS NV1 SYS
SYS SYS SYS NV1
NV1 NV1 NV2
NV2 NV1
NV2
"""


def _pcie(a: int, b: int) -> str:
    if a // 4 != b // 4:
        return "SYS"
    return "PIX" if a // 2 == b // 2 else "NODE"


def kep_v100() -> GpuTopology:
    links = []
    for a, row in enumerate(line.split() for line in KEP_MATRIX.strip().splitlines()):
        for offset, cell in enumerate(row):
            b = a + 1 + offset
            links.append(Link(a, b, _pcie(a, b), int(cell[2:]) if cell.startswith("NV") else 0))
    return GpuTopology([f"GPU-{i}" for i in range(8)], links)


def pcie_only(count: int = 8) -> GpuTopology:
    links = [Link(a, b, _pcie(a, b)) for a in range(count) for b in range(a + 1, count)]
    return GpuTopology([f"GPU-{i}" for i in range(count)], links)
