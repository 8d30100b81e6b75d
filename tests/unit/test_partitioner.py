import random
import zlib

from broker.client.partitioner import choose_partition, partition_for_key


def test_key_partition_is_crc32_modulo_count():
    assert partition_for_key(b"user-42", 8) == (zlib.crc32(b"user-42") & 0x7FFFFFFF) % 8


def test_keyed_message_keeps_its_partition_when_that_partition_is_down():
    leaders = {0: 1, 1: -1, 2: 1, 3: -1}
    key = next(k for k in (b"%d" % i for i in range(100)) if partition_for_key(k, 4) == 1)
    assert choose_partition(key, leaders) == 1


def test_unkeyed_message_goes_only_to_available_partitions():
    leaders = {0: 1, 1: -1, 2: 0, 3: -1}
    rng = random.Random(1)
    assert {choose_partition(None, leaders, rng=rng) for _ in range(200)} == {0, 2}


def test_unkeyed_retry_avoids_the_partition_that_failed():
    rng = random.Random(1)
    assert {choose_partition(None, {0: 0, 1: 1}, avoid=0, rng=rng) for _ in range(50)} == {1}


def test_no_available_partition_gives_none():
    assert choose_partition(None, {0: -1, 1: -1}) is None
