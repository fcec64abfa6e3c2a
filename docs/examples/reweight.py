"""A worked custom processor: scale every attributed share by a per-namespace factor.

Load it by import path, no packaging needed::

    processors:
      custom/reweight: {class: "reweight:Reweight", factor: 0.5, pids: [4242]}

(run wattpipe from this folder, or put it on PYTHONPATH). It is kept honest by
tests/processors/test_docs_example.py.
"""

from __future__ import annotations

import dataclasses

from wattpipe.pipeline.batch import Batch


class Reweight:
    # The order check reads these: this processor must come after whatever provides "shares".
    needs = frozenset({"shares"})
    provides = frozenset({"shares"})

    def __init__(self, *, factor: float, pids: list[int]) -> None:
        if factor < 0:
            raise ValueError("factor must be >= 0")
        self.factor = factor
        self.pids = set(pids)

    def process(self, batch: Batch) -> Batch:
        shares = tuple(
            dataclasses.replace(s, energy_mj=round(s.energy_mj * self.factor), power_w=s.power_w * self.factor)
            if s.pid in self.pids
            else s
            for s in batch.shares
        )
        return batch.replace(shares=shares)
