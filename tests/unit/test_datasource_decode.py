"""The Spark data source's decoder names the partition and offset of an entry it
cannot decode, plain or compressed, instead of failing without saying where."""

from __future__ import annotations

import pytest

from broker.common.errors import InvalidMessage
from broker.common.message import encode_message_set

from airflow_provider_logbus.spark.datasource import decode_record_batch

MESSAGES = [(None, b"value-%d" % i, 1_704_067_200_000 + i) for i in range(3)]


@pytest.mark.parametrize("codec", [0, 1])
def test_good_entries_decode_to_one_row_each(codec):
    batch = decode_record_batch("t", 3, 1000, bytes(encode_message_set(MESSAGES, codec)))
    assert batch.column("value").to_pylist() == [m[1] for m in MESSAGES]
    assert set(batch.column("partition").to_pylist()) == {3}


@pytest.mark.parametrize("codec", [0, 1])
def test_a_corrupt_entry_fails_naming_partition_and_offset(codec):
    buf = bytearray(encode_message_set(MESSAGES, codec))
    buf[-1] ^= 0xFF  # the last byte of the last entry's value
    with pytest.raises(InvalidMessage, match=r"t-3: corrupt entry at offset \d+"):
        decode_record_batch("t", 3, 1000, bytes(buf))
