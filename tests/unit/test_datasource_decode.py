"""The format's Arrow decoder (`broker.common.columns_arrow`, what the Spark data source reads
with) gives one row per message — plain, compressed, or in a producer batch — and names
the partition and offset of an entry it cannot decode instead of failing without saying
where."""

from __future__ import annotations

import pytest

from broker.common.errors import InvalidMessage
from broker.common.columns_arrow import decode_arrow as decode_record_batch
from broker.common.message import BatchIdentity, encode_batch, encode_message_set, iter_messages

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
def test_a_producer_batch_decodes_to_one_row_per_message_at_the_batchs_offset_plus_its_index(codec):
    plain = encode_message_set(MESSAGES[:1])
    buf = plain + encode_batch(MESSAGES, BatchIdentity(9, 0, 0, 3), codec)
    batch = decode_record_batch("t", 3, 1000, buf)
    assert batch.column("value").to_pylist() == [MESSAGES[0][1]] + [m[1] for m in MESSAGES]
    assert batch.column("offset").to_pylist() == [1000] + [1000 + len(plain) + i for i in range(3)]


BATCH = [(None if i % 2 else b"k%d" % i, b"value-%d" % i, 1_704_067_200_000 + i) for i in range(5)]


def _batches(codec) -> bytes:
    """Two producer batches (magic 3) and a plain entry after them."""
    return (encode_batch(BATCH[:3], BatchIdentity(9, 0, 0, 3), codec)
            + encode_batch(BATCH[3:], BatchIdentity(9, 0, 3, 2), codec)
            + encode_message_set([(b"tail", b"plain", 1_704_067_200_009)]))


@pytest.mark.parametrize("codec", [0, 1])
def test_producer_batches_decode_to_the_rows_iteration_gives(codec):
    buf = _batches(codec)
    batch = decode_record_batch("t", 3, 1000, buf)
    expected = list(iter_messages(buf, 1000))
    assert batch.num_rows == 6
    assert batch.column("offset").to_pylist() == [m.offset for m in expected]
    assert batch.column("key").to_pylist() == [m.key for m in expected]
    assert batch.column("value").to_pylist() == [m.value for m in expected]
    assert [int(t.timestamp() * 1000) for t in batch.column("timestamp").to_pylist()] == [m.timestamp for m in expected]
    assert set(batch.column("topic").to_pylist()) == {"t"}


@pytest.mark.parametrize("codec", [0, 1])
def test_a_corrupt_producer_batch_fails_naming_partition_and_offset(codec):
    buf = bytearray(_batches(codec))
    first = len(encode_batch(BATCH[:3], BatchIdentity(9, 0, 0, 3), codec))
    buf[first + 45] ^= 0xFF  # inside the second batch
    with pytest.raises(InvalidMessage, match=rf"t-3: corrupt entry at offset {1000 + first}: "):
        decode_record_batch("t", 3, 1000, bytes(buf))


def test_a_set_cut_inside_an_entry_is_refused_not_shortened():
    buf = _batches(0)
    with pytest.raises(InvalidMessage, match="partial entry"):
        decode_record_batch("t", 3, 1000, buf[:-3])
