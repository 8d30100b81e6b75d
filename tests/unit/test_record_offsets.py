"""Every record its own offset: the entry's position plus the record's index
(docs/architecture.md, "Offsets"), unique across a partition's entries, and the rule
that keeps it so (an entry spans at least as many bytes as it holds records)."""

import pytest

from broker.common.columns import decode_columns
from broker.common.errors import InvalidMessage
from broker.common.compression import compress
from broker.common.message import (
    BatchIdentity, Codec, append_entry, encode_batch, encode_message_set, iter_messages, validate_message_set,
)
from broker.common.records import count_records, entry_records


def mixed_set() -> bytes:
    """A plain entry, a producer batch of 5, a gzip set of 3, two plain entries."""
    return (encode_message_set([(None, b"first", 1)])
            + encode_batch([(None, b"b%d" % i, 2) for i in range(5)], BatchIdentity(7, 0, 0, 5), Codec.GZIP)
            + encode_message_set([(None, b"g%d" % i, 3) for i in range(3)], Codec.GZIP)
            + encode_message_set([(b"k", b"last-1", 4), (None, b"last-2", 5)]))


def test_offsets_are_unique_and_increasing_across_plain_batched_and_compressed_entries():
    messages = list(iter_messages(mixed_set(), 10_000))
    offsets = [m.offset for m in messages]
    assert len(messages) == 11
    assert offsets == sorted(set(offsets)), "offsets repeat or go back"
    assert [m.next_offset for m in messages[:-1]] == offsets[1:], "each record resumes at the next one"
    assert messages[-1].next_offset == 10_000 + len(mixed_set())


def test_the_columns_decoder_gives_the_same_offsets_as_iter_messages():
    data = mixed_set()
    columns = decode_columns(data, 10_000)
    messages = list(iter_messages(data, 10_000))
    assert list(columns.offsets) == [m.offset for m in messages]
    assert list(columns.next_offsets) == [m.next_offset for m in messages]


def test_a_reader_resumes_in_the_middle_of_a_batch_at_a_records_next_offset():
    data = mixed_set()
    messages = list(iter_messages(data, 0))
    resume = messages[3].next_offset  # after the third record of the producer batch
    rest = [m for m in iter_messages(data, 0) if m.offset >= resume]
    assert [m.value for m in rest] == [m.value for m in messages[4:]]


def test_records_are_counted_per_entry_and_per_set():
    data = mixed_set()
    assert count_records(data) == 11 == validate_message_set(data, 1 << 20).records
    assert entry_records(data, 0) == 1
    assert count_records(data[:-3]) == 10, "a partial last entry counts for nothing"


def too_many_for_its_bytes(count: int = 3000) -> bytes:
    """A zstd set of `count` empty messages in one wrapper (what writers no longer make)."""
    wrapper = bytearray()
    append_entry(wrapper, compress(Codec.ZSTD, encode_message_set([(None, b"", 1)] * count)), None, 1, int(Codec.ZSTD))
    return bytes(wrapper)


def test_a_compressed_set_with_more_records_than_bytes_is_refused_with_the_reason():
    tiny = too_many_for_its_bytes()
    assert len(tiny) < 3000
    with pytest.raises(InvalidMessage, match="3000 messages in .* bytes.*send them uncompressed"):
        validate_message_set(tiny, 1 << 20)


def test_an_old_entry_breaking_the_rule_reads_without_running_into_the_next_entry():
    """Written before the rule: its surplus records share the entry's last offset."""
    tiny = too_many_for_its_bytes()
    data = tiny + encode_message_set([(None, b"after", 2)])
    messages = list(iter_messages(data, 0))
    assert len(messages) == 3001
    assert max(m.offset for m in messages[:-1]) == len(tiny) - 1 < messages[-1].offset == len(tiny)
    assert list(decode_columns(data, 0).offsets) == [m.offset for m in messages]
