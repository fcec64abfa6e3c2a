"""Self-telemetry: rate-limited logging, readiness on the clock, and /metrics /healthz /readyz over HTTP."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client import generate_latest

from wattpipe.pipeline.clock import SteppedClock
from wattpipe.pipeline.httpserver import HttpServer, parse_listen
from wattpipe.pipeline.telemetry import RateLimitedLog, Telemetry


class ListHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def lines() -> Iterator[list[str]]:
    handler = ListHandler()
    logger = logging.getLogger("test.telemetry.ratelimit")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield handler.lines
    logger.removeHandler(handler)


def rate_limited(clock: SteppedClock, **options: float) -> RateLimitedLog:
    return RateLimitedLog(logging.getLogger("test.telemetry.ratelimit"), clock, **options)  # type: ignore[arg-type]


# --- rate-limited logging --------------------------------------------------------------------


def test_same_key_is_logged_once_per_period(lines: list[str]) -> None:
    clock = SteppedClock()
    log = rate_limited(clock)

    results = [log.log(logging.WARNING, "gpu/timeout", "receiver gpu timed out")]
    for _ in range(3):
        clock.advance(19.0)  # 57 s after the first: still inside the minute
        results.append(log.log(logging.WARNING, "gpu/timeout", "receiver gpu timed out"))

    assert results == [True, False, False, False]
    assert lines == ["receiver gpu timed out"]


def test_after_the_period_it_logs_again_with_how_many_were_held_back(lines: list[str]) -> None:
    clock = SteppedClock()
    log = rate_limited(clock)
    log.log(logging.WARNING, "k", "failed")
    for _ in range(3):
        clock.advance(10.0)
        log.log(logging.WARNING, "k", "failed")

    clock.advance(30.0)  # exactly 60 s after the first line
    assert log.log(logging.WARNING, "k", "failed") is True
    clock.advance(60.0)
    assert log.log(logging.WARNING, "k", "failed") is True  # nothing held back this time

    assert lines == ["failed", "failed (3 more like this in the last 60s)", "failed"]


def test_held_back_count_names_the_time_since_the_last_line_not_the_period(lines: list[str]) -> None:
    clock = SteppedClock()
    log = rate_limited(clock)
    log.log(logging.WARNING, "k", "failed")
    clock.advance(1.0)
    log.log(logging.WARNING, "k", "failed")
    clock.advance(299.0)

    log.log(logging.WARNING, "k", "failed")

    assert lines[-1] == "failed (1 more like this in the last 300s)"


def test_different_keys_are_limited_independently(lines: list[str]) -> None:
    clock = SteppedClock()
    log = rate_limited(clock)

    assert log.log(logging.WARNING, "a", "a failed") is True
    assert log.log(logging.WARNING, "b", "b failed") is True
    assert log.log(logging.WARNING, "a", "a failed") is False
    clock.advance(30.0)
    assert log.log(logging.WARNING, "c", "c failed") is True

    assert lines == ["a failed", "b failed", "c failed"]


def test_key_memory_is_bounded_by_forgetting_the_oldest_keys(lines: list[str]) -> None:
    clock = SteppedClock()
    log = rate_limited(clock, max_keys=4)
    for i in range(5):  # the fifth key makes room by forgetting the oldest quarter: key-0
        log.log(logging.WARNING, f"key-{i}", f"error {i}")
        clock.advance(1.0)

    assert log.log(logging.WARNING, "key-0", "error 0") is True  # forgotten: logs at once
    assert log.log(logging.WARNING, "key-4", "error 4") is False  # still remembered
    assert len(lines) == 6


def test_key_memory_is_bounded_even_below_four_keys() -> None:
    clock = SteppedClock()
    log = rate_limited(clock, max_keys=2)
    for key in ("a", "b", "c"):
        log.log(logging.WARNING, key, key)
        clock.advance(1.0)

    assert log.log(logging.WARNING, "a", "a") is True  # "a" was forgotten to make room for "c"
    assert log.log(logging.WARNING, "c", "c") is False


def test_period_zero_logs_every_time_and_bad_settings_are_rejected(lines: list[str]) -> None:
    clock = SteppedClock()
    log = rate_limited(clock, period_s=0.0)
    assert [log.log(logging.INFO, "k", "x") for _ in range(3)] == [True, True, True]
    assert lines == ["x", "x", "x"]

    with pytest.raises(ValueError, match="max_keys >= 1"):
        rate_limited(clock, max_keys=0)
    with pytest.raises(ValueError, match="period_s >= 0"):
        rate_limited(clock, period_s=-1.0)


# --- readiness and counters ------------------------------------------------------------------


def test_not_ready_before_any_tick_then_ready_after_one() -> None:
    clock = SteppedClock()
    telemetry = Telemetry(clock)
    telemetry.register_pipeline("metrics", 5.0)

    assert telemetry.ready() == (False, "pipeline metrics: no tick has finished yet")
    clock.advance(5.0)
    telemetry.tick_finished("metrics", 0.25)
    assert telemetry.ready() == (True, "ok")


def test_not_ready_when_the_last_tick_is_older_than_three_intervals() -> None:
    clock = SteppedClock()
    telemetry = Telemetry(clock)
    telemetry.register_pipeline("metrics", 5.0)
    telemetry.tick_finished("metrics", 0.1)

    clock.advance(15.0)
    assert telemetry.ready() == (True, "ok")  # exactly three intervals: still fine
    clock.advance(0.5)
    assert telemetry.ready() == (False, "pipeline metrics: last tick finished 15.5s ago (interval 5s)")
    telemetry.tick_finished("metrics", 0.1)
    assert telemetry.ready() == (True, "ok")


def test_every_pipeline_must_have_ticked_to_be_ready() -> None:
    clock = SteppedClock()
    telemetry = Telemetry(clock)
    telemetry.register_pipeline("metrics", 5.0)
    telemetry.register_pipeline("metrics/slow", 60.0)
    telemetry.tick_finished("metrics", 0.1)

    assert telemetry.ready() == (False, "pipeline metrics/slow: no tick has finished yet")
    clock.advance(100.0)
    telemetry.tick_finished("metrics/slow", 0.1)
    # metrics ticked 100 s ago, more than 3 × 5 s
    assert telemetry.ready() == (False, "pipeline metrics: last tick finished 100.0s ago (interval 5s)")


def test_tick_finished_observes_the_duration_per_pipeline() -> None:
    telemetry = Telemetry(SteppedClock())
    telemetry.register_pipeline("metrics", 5.0)
    telemetry.tick_finished("metrics", 0.25)
    telemetry.tick_finished("metrics", 0.5)

    sample = telemetry.registry.get_sample_value
    assert sample("wattpipe_tick_duration_seconds_count", {"pipeline": "metrics"}) == 2
    assert sample("wattpipe_tick_duration_seconds_sum", {"pipeline": "metrics"}) == 0.75
    assert sample("wattpipe_tick_duration_seconds_bucket", {"pipeline": "metrics", "le": "0.25"}) == 1


def test_component_telemetry_counts_drops_under_its_component_id() -> None:
    telemetry = Telemetry(SteppedClock())
    component = telemetry.for_component("exporter", "otlp/main", logging.getLogger("test.telemetry"))

    component.dropped("metrics", 7)
    component.dropped("metrics", 3)

    assert component.registry is telemetry.registry
    value = telemetry.registry.get_sample_value(
        "wattpipe_exporter_dropped_total", {"pipeline": "metrics", "component": "otlp/main"}
    )
    assert value == 10


def test_each_telemetry_has_its_own_registry() -> None:
    first, second = Telemetry(SteppedClock()), Telemetry(SteppedClock())  # no "duplicated timeseries"
    first.receiver_errors.labels(pipeline="metrics", component="gpu").inc()

    labels = {"pipeline": "metrics", "component": "gpu"}
    assert first.registry.get_sample_value("wattpipe_receiver_errors_total", labels) == 1
    assert second.registry.get_sample_value("wattpipe_receiver_errors_total", labels) is None


# --- HTTP ------------------------------------------------------------------------------------


@pytest.fixture
def served() -> Iterator[tuple[Telemetry, SteppedClock, httpx.Client]]:
    clock = SteppedClock()
    telemetry = Telemetry(clock)
    telemetry.register_pipeline("metrics", 5.0)
    server = telemetry.serve("127.0.0.1:0")
    try:
        with httpx.Client(base_url=server.url, timeout=5.0) as client:
            yield telemetry, clock, client
    finally:
        telemetry.close()


def test_metrics_endpoint_serves_tick_durations_and_counters(
    served: tuple[Telemetry, SteppedClock, httpx.Client],
) -> None:
    telemetry, _, client = served
    telemetry.tick_finished("metrics", 0.02)
    telemetry.receiver_errors.labels(pipeline="metrics", component="custom/gpu").inc(2)

    response = client.get("/metrics")

    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    body = response.text
    assert 'wattpipe_tick_duration_seconds_count{pipeline="metrics"} 1.0' in body
    assert 'wattpipe_receiver_errors_total{component="custom/gpu",pipeline="metrics"} 2.0' in body
    counters = sorted(
        line.split()[2] for line in body.splitlines() if line.startswith("# TYPE") and line.endswith(" counter")
    )
    assert counters == [
        "wattpipe_exporter_dropped_total",
        "wattpipe_exporter_failed_total",
        "wattpipe_exporter_sent_total",
        "wattpipe_processor_errors_total",
        "wattpipe_receiver_errors_total",
        "wattpipe_receiver_records_total",
    ]


def test_healthz_is_always_ok(served: tuple[Telemetry, SteppedClock, httpx.Client]) -> None:
    _, _, client = served
    response = client.get("/healthz")
    assert (response.status_code, response.text) == (200, "ok\n")


def test_readyz_is_503_until_a_tick_finished_then_200_then_503_when_stale(
    served: tuple[Telemetry, SteppedClock, httpx.Client],
) -> None:
    telemetry, clock, client = served

    before = client.get("/readyz")
    telemetry.tick_finished("metrics", 0.1)
    after = client.get("/readyz")
    clock.advance(16.0)
    stale = client.get("/readyz")

    assert (before.status_code, before.text) == (503, "pipeline metrics: no tick has finished yet\n")
    assert (after.status_code, after.text) == (200, "ok\n")
    assert stale.status_code == 503
    assert "16.0s ago" in stale.text


def test_unknown_path_is_404_pointing_at_the_known_ones(served: tuple[Telemetry, SteppedClock, httpx.Client]) -> None:
    _, _, client = served
    response = client.get("/metric")
    assert response.status_code == 404
    assert "/metrics, /healthz or /readyz" in response.text


def test_close_stops_serving_and_serving_again_replaces_the_old_server() -> None:
    telemetry = Telemetry(SteppedClock())
    first = telemetry.serve("127.0.0.1:0")
    second = telemetry.serve("127.0.0.1:0")  # the first is closed, not leaked
    try:
        assert httpx.get(f"{second.url}/healthz", timeout=5.0).status_code == 200
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{first.url}/healthz", timeout=5.0)
    finally:
        telemetry.close()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{second.url}/healthz", timeout=5.0)


def test_closing_a_server_that_never_started_returns_at_once() -> None:
    server = HttpServer("127.0.0.1:0", lambda environ, start_response: [b""])
    closer = threading.Thread(target=server.close, daemon=True)
    closer.start()
    closer.join(timeout=2.0)
    assert not closer.is_alive()


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="no IPv6 loopback here")
def test_ipv6_listen_address_is_served_and_bracketed_in_the_url() -> None:
    telemetry = Telemetry(SteppedClock())
    server = telemetry.serve("[::1]:0")
    try:
        assert server.url == f"http://[::1]:{server.port}"
        assert httpx.get(f"{server.url}/healthz", timeout=5.0).text == "ok\n"
    finally:
        telemetry.close()


@pytest.mark.parametrize(
    ("listen", "expected"),
    [
        ("127.0.0.1:8888", ("127.0.0.1", 8888)),
        ("0.0.0.0:28282", ("0.0.0.0", 28282)),
        (":9090", ("0.0.0.0", 9090)),
        ("localhost:0", ("localhost", 0)),
        ("[::1]:8080", ("::1", 8080)),
        ("[::]:65535", ("::", 65535)),
    ],
)
def test_parse_listen_accepts_host_and_port(listen: str, expected: tuple[str, int]) -> None:
    assert parse_listen(listen) == expected


@pytest.mark.parametrize(
    ("listen", "message"),
    [
        ("8888", "is not host:port"),
        ("127.0.0.1:", "is not host:port"),
        ("127.0.0.1:http", "is not host:port"),
        ("127.0.0.1:-1", "is not host:port"),
        ("127.0.0.1:٨٨", "is not host:port"),  # Arabic-Indic digits: isdigit(), but not a port
        ("", "is not host:port"),
        ("127.0.0.1:65536", "port 65536 in '127.0.0.1:65536' is out of range 0–65535"),
    ],
)
def test_parse_listen_rejects_what_is_not_host_and_port(listen: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_listen(listen)


def test_a_component_counter_is_made_once_and_labelled_with_the_component() -> None:
    telemetry = Telemetry(SteppedClock())
    a = telemetry.for_component("receiver", "nvml/a", logging.getLogger("t"))
    b = telemetry.for_component("receiver", "nvml/b", logging.getLogger("t"))
    ca = a.counter("wattpipe_nvml_device_failures", "GPU reads that failed.", ("gpu", "reason"))
    cb = b.counter("wattpipe_nvml_device_failures", "GPU reads that failed.", ("gpu", "reason"))
    ca.inc(gpu="0", reason="lost")
    ca.inc(2, gpu="0", reason="lost")
    cb.inc(gpu="1", reason="open")
    assert ca.value(gpu="0", reason="lost") == 3
    assert ca.value(gpu="1", reason="open") == 0  # b's count is b's
    assert cb.value(gpu="1", reason="open") == 1
    text = generate_latest(telemetry.registry).decode()
    assert 'wattpipe_nvml_device_failures_total{component="nvml/a",gpu="0",reason="lost"} 3.0' in text
    assert 'wattpipe_nvml_device_failures_total{component="nvml/b",gpu="1",reason="open"} 1.0' in text
    with pytest.raises(ValueError, match="has labels"):
        a.counter("wattpipe_nvml_device_failures", "GPU reads that failed.", ("gpu",))
