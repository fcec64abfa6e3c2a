"""rev3 review: a VM's CPU totals are kind "vm" now; what lists the kinds says so."""

from __future__ import annotations

from typing import get_args

from wattpipe.pipeline.records import RecordKind
from wattpipe.processors import filter as filter_processor


def test_the_filter_processors_description_lists_every_kind_it_accepts() -> None:
    # `wattpipe components` prints it: a user looking for how to select VMs must find "vm" there.
    description = filter_processor.factory.description
    for kind in get_args(RecordKind):
        assert kind in description, kind
