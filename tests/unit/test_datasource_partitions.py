"""The Spark data source's input partitions: one per non-empty range (no cluster needed
while no range is larger than `split_bytes`)."""

from __future__ import annotations

from airflow_provider_logbus.plan import Range, ranges_to_json
from airflow_provider_logbus.spark.datasource import LogbusReader


def reader(ranges: list[Range]) -> LogbusReader:
    return LogbusReader({"ranges": ranges_to_json(ranges), "zookeeper": "127.0.0.1:1/unused"})


def test_each_non_empty_range_is_one_partition():
    spans = [p.span for p in reader([Range("t", 0, 0, 100), Range("t", 1, 50, 50), Range("u", 2, 10, 20)]).partitions()]
    assert spans == [Range("t", 0, 0, 100), Range("u", 2, 10, 20)]


def test_a_batch_with_nothing_to_read_still_gives_spark_one_empty_partition():
    (only,) = reader([Range("t", 0, 7, 7)]).partitions()
    assert only.span.end <= only.span.start
    assert list(reader([]).read(only)) == []
