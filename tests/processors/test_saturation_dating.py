"""dcgm-exporter's values in the saturation window are dated by the collection they describe, not the scrape."""

from __future__ import annotations

import pytest

from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import Timestamp
from wattpipe.pipeline.records import DeviceSample, DeviceSignals, Record, Saturation
from wattpipe.processors._saturation_dating import CollectionDating
from wattpipe.processors.saturation import SaturationConfig, SaturationProcessor

GPU = "GPU-00000000-0000-0000-0000-000000000001"


def _ts(t: float) -> Timestamp:
    return Timestamp(t, 1_700_000_000 + t)


def _dcgm(t: float, fields: dict[str, float], collected: tuple[float, float] | None) -> DeviceSignals:
    """A dcgm answer at scrape ``t``: a new collection seen in ``collected`` = (after, by), or a repeat."""
    return DeviceSignals(
        time=_ts(t),
        device_id=GPU,
        fields=tuple(sorted(fields.items())),
        collected_after_s=collected[0] if collected else None,
        collected_by_s=collected[1] if collected else None,
        collect_s=10.0,
    )


def _process(processor: SaturationProcessor, t: float, records: list[Record]) -> dict[str, Saturation]:
    batch = processor.process(Batch(time=_ts(t), interval_s=5.0, node="n").with_records(records))
    return {s.signal: s for s in batch.saturation}


def test_the_counter_reading_places_the_collection_within_its_tick() -> None:
    dating = CollectionDating()
    dating.reading(GPU, 10.0, 1_000_000.0)
    dating.reading(GPU, 15.0, 1_500_000.0)  # 100 W: 100 J a second
    assert dating.place(GPU, 10.0, 15.0, 1_300.0) == pytest.approx(13.0)  # 300 J into the tick
    assert dating.place(GPU, 10.0, 15.0, 9_999.0) == 15.0  # no tick brackets it: the scrape that saw it
    assert dating.place(GPU, 10.0, 15.0, None) == 15.0  # no energy field printed
    assert dating.place(GPU, 13.5, 15.0, 1_300.0) == 13.5  # never outside what the scrapes say


def test_repeats_add_nothing_and_the_window_ends_at_the_last_collection() -> None:
    # Collections every 10 s of a thermal counter that runs from 20 s; the scrapes every 5 s repeat each
    # collection once. The first dated collection only starts the counter.
    processor = SaturationProcessor(SaturationConfig(window=20.0))
    got: dict[str, Saturation] = {}
    for scrape in range(10, 60, 5):
        collection = float(scrape - scrape % 10)
        new = (collection - 5.0, collection) if scrape % 10 == 0 else None
        thermal = max(0.0, collection - 20.0)
        got = _process(processor, float(scrape), [_dcgm(float(scrape), {"thermal_violation_s": thermal}, new)])
    # The last scrape (55 s) repeats the 50 s collection: the window is (30, 50], all of it throttled.
    assert got["throttle_thermal"].window_end_s == 50.0
    assert got["throttle_thermal"].window_s == 20.0
    assert got["throttle_thermal"].value == 1.0


def test_a_collection_is_dated_by_the_energy_counter_among_nvml_readings() -> None:
    # 100 W from 0 s; collections at 3, 13, 23 s, seen by the scrapes at 5, 15, 25 s (the one at 3 s only
    # starts the counters). The power counter runs from 13 s: (3, 23] holds 10 s of it, 0.5; dated by the
    # scrapes the same value would claim (5, 25], whose truth is 12/20.
    processor = SaturationProcessor(SaturationConfig(window=60.0))
    got: dict[str, Saturation] = {}
    for scrape in range(0, 30, 5):
        t = float(scrape)
        collection = t - 2.0 if scrape % 10 == 5 else None
        records: list[Record] = [DeviceSample(time=_ts(t), device_id=GPU, energy_mj=t * 100_000.0)]
        if collection is not None and collection > 0:
            fields = {"power_violation_s": max(0.0, collection - 13.0), "energy_j": collection * 100.0}
            records.append(_dcgm(t, fields, (t - 5.0, t)))
        got = _process(processor, t, records)
    assert got["throttle_power"].window_end_s == pytest.approx(23.0)
    assert got["throttle_power"].window_s == pytest.approx(20.0)
    assert got["throttle_power"].value == pytest.approx(0.5)


def test_nvml_values_keep_the_tick_and_dcgm_values_their_collection() -> None:
    processor = SaturationProcessor(SaturationConfig())
    for t in (0.0, 5.0, 10.0):
        nvml = DeviceSignals(time=_ts(t), device_id=GPU, fields=(("xid_count", t),), source="nvml")
        dcgm = _dcgm(t, {"sm_active": 0.5, "xid_last": 13.0}, (t - 5.0, t - 1.0) if t else None)
        got = _process(processor, t, [nvml, dcgm])
    assert got["xid_count"].value == 10.0  # nvml's exact count wins over dcgm's last code
    assert got["xid_count"].window_end_s == 10.0  # the tick's
    assert got["sm_active_avg"].window_end_s == 9.0  # the collection's (seen by 9 s: no energy to place it)


def test_signals_read_at_an_instant_come_from_nvml_every_tick_not_dcgm_every_collection() -> None:
    # Framebuffer use and the clock-event bitmask are readings of an instant: NVML reads them every tick, dcgm
    # once per collection (30 s here), so NVML's readings cover the window more finely. Memory is 50 % until
    # 20 s, then 100 %; the bitmask says sw_power_cap from 20 s. dcgm's two collections (at 0 and 30 s, seen by
    # the scrapes after them) see 50 % and 100 %; NVML's ticks every 5 s see the change when it happens.
    processor = SaturationProcessor(SaturationConfig(window=60.0))
    got: dict[str, Saturation] = {}
    for t in (0.0, 5.0, 10.0, 15.0, 20.0, 25.0, 30.0, 35.0, 40.0):
        used = 50.0 if t < 20.0 else 100.0
        nvml = DeviceSignals(
            time=_ts(t),
            device_id=GPU,
            fields=(
                ("clocks_event_reasons", 0x4 if t >= 20.0 else 0.0),
                ("fb_total_bytes", 100.0),
                ("fb_used_bytes", used),
            ),
            source="nvml",
        )
        collection = 30.0 if t >= 30.0 else 0.0
        dcgm_used = 50.0 if collection < 20.0 else 100.0
        dcgm = _dcgm(
            t,
            {
                "fb_total_bytes": 100.0,
                "fb_used_bytes": dcgm_used,
                "clocks_event_reasons": 0x4 if collection >= 20.0 else 0,
            },
            (collection - 1.0, collection) if t in (5.0, 35.0) else None,
        )
        got = _process(processor, t, [nvml, dcgm])
    # NVML's nine ticks: 4 at 50 %, 5 at 100 %.
    assert got["memory_used_avg"].value == pytest.approx((4 * 0.5 + 5 * 1.0) / 9)
    assert got["memory_used_avg"].window_end_s == 40.0  # the tick's window, not the collection's
    assert got["clock_event_sw_power_cap"].value == pytest.approx(5 / 9)
