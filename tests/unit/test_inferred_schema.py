"""An inferred schema has one field per name as Spark resolves names (without case):
a key repeated in a value, or spelled two ways across the sample, would otherwise make
every column of that name unselectable and fail the load."""

from __future__ import annotations

import logging

from pyspark.sql.types import LongType, StringType, StructField, StructType

from airflow_provider_logbus.spark.decode import _one_field_per_name


def test_the_spelling_most_values_use_is_kept_and_the_choice_logged(caplog):
    inferred = StructType([StructField("Server", StringType()), StructField("n", LongType()),
                           StructField("n", LongType()), StructField("server", StringType())])
    sample = ['{"server": "a", "n": 1}', '{"server": "b", "n": 2, "n": 3}', '{"Server": "c"}', "not json", "[1]"]
    with caplog.at_level(logging.WARNING, logger="logbus.load_job"):
        fields = _one_field_per_name(inferred, sample).fields
    assert [f.name for f in fields] == ["n", "server"]
    assert "Server" in caplog.text and "the spelling most values use: n, server" in caplog.text


def test_a_schema_without_repeats_is_left_alone():
    inferred = StructType([StructField("a", StringType()), StructField("b", LongType())])
    assert _one_field_per_name(inferred, []) is inferred
