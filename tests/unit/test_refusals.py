"""Refused requests are logged once per connection and reason, repeats counted."""

import logging

from broker.common.protocol import ApiKey, ProduceRequest, decode_request_header, encode_request
from broker.server.connection import acks_zero
from broker.server.refusals import RefusalLog


def test_first_refusal_of_each_reason_is_logged_and_repeats_are_summed_up(caplog):
    log = RefusalLog(logging.getLogger("test.refusals"), "1.2.3.4:5")
    with caplog.at_level(logging.WARNING, "test.refusals"):
        for _ in range(100):
            log.warning("PRODUCE InvalidMessage", "bad crc %d", 1)
        log.warning("FETCH UnknownTopic", "no topic")
        log.close()
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "1.2.3.4:5: bad crc 1",
        "1.2.3.4:5: no topic",
        "1.2.3.4:5: 99 more refusals of PRODUCE InvalidMessage were not logged one by one",
    ]


def test_a_reason_is_logged_again_after_the_interval_with_its_count(caplog):
    log = RefusalLog(logging.getLogger("test.refusals"), "peer", interval=0.0)
    with caplog.at_level(logging.WARNING, "test.refusals"):
        log.warning("r", "again")
        log.warning("r", "again")
    assert len(caplog.records) == 2


def _frame_parts(body: bytes, api: ApiKey = ApiKey.PRODUCE):
    frame = encode_request(api, 1, "c", body)[4:]
    header, reader = decode_request_header(frame)
    return header.api_key, header.api_version, frame, reader.pos


def test_acks_zero_reads_the_first_body_byte_of_produce_requests_only():
    assert acks_zero(*_frame_parts(ProduceRequest(0, 1, "t", 0, b"").encode())) is True
    assert acks_zero(*_frame_parts(ProduceRequest(1, 1, "t", 0, b"").encode())) is False
    assert acks_zero(*_frame_parts(b"")) is None  # too short to say: the connection closes
    assert acks_zero(*_frame_parts(b"\x00\x00\x00\x00", ApiKey.METADATA)) is False
