"""The format's Arrow decoder (`broker.common.columns`, what the Spark data source reads
with) gives one row per message — plain, compressed, or in a producer batch — and names
the partition and offset of an entry it cannot decode instead of failing without saying
where."""

from __future__ import annotations

import pytest

from broker.common.errors import InvalidMessage
from broker.common.columns import decode_arrow as decode_record_batch
from broker.common.message import BatchIdentity, encode_batch, encode_message_set

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


@pytest.mark.parametrize("codec", [None, "gzip"])
def test_a_producer_batch_decodes_to_one_row_per_message_at_the_batchs_offset(codec):
    plain = encode_message_set(MESSAGES[:1])
    buf = plain + encode_batch(MESSAGES, BatchIdentity(9, 0, 0, 3), codec)
    batch = decode_record_batch("t", 3, 1000, buf)
    assert batch.column("value").to_pylist() == [MESSAGES[0][1]] + [m[1] for m in MESSAGES]
    assert batch.column("offset").to_pylist() == [1000] + [1000 + len(plain)] * 3
