"""`storage.Storage` behaves the same on a disk and on a real S3 API server (harness.s3),
a staged batch is read and trimmed in a bucket as on a disk, the catalog connection turns
an `aws` connection into pyiceberg's `s3.*` properties, and a warehouse the target cannot
write fails naming it, before Spark starts."""

from __future__ import annotations

import json
import uuid

import pyarrow as pa
import pytest

from airflow_provider_logbus.plan import Range
from airflow_provider_logbus.staged import StagedBatch
from airflow_provider_logbus.storage import Storage, join
from airflow_provider_logbus.targets.base import TargetError
from airflow_provider_logbus.targets.iceberg import IcebergTarget
from airflow_provider_logbus.targets.iceberg_tables import embedded_catalog
from harness.s3 import ACCESS_KEY, REGION, SECRET_KEY

from .stagingutil import offsets, write_staging


@pytest.fixture(params=["disk", "s3"])
def place(request, tmp_path) -> tuple[Storage, str]:
    """(storage, a location under which nothing exists yet)."""
    if request.param == "disk":
        return Storage(), str(tmp_path / "root")
    server = request.getfixturevalue("s3_server")
    return Storage(server.properties()), join(server.create_bucket(f"st-{uuid.uuid4().hex[:12]}"), "root")


def test_files_directories_and_deletion_behave_alike(place):
    storage, root = place
    assert not storage.exists(root) and not storage.is_dir(root) and storage.files(root) == []
    storage.make_dirs(join(root, "a/h=1"))
    storage.make_dirs(join(root, "a/h=2"))
    storage.write_json(join(root, "a/info.json"), {"n": 1})
    storage.write_parquet(join(root, "a/h=1/part-0.parquet"), pa.table({"x": [1, 2, 3]}))
    storage.write_parquet(join(root, "a/h=2/part-0.parquet"), pa.table({"x": [4]}))
    assert storage.is_dir(join(root, "a")) and storage.exists(join(root, "a/info.json"))
    assert storage.files(root, ".parquet") == [join(root, "a/h=1/part-0.parquet"), join(root, "a/h=2/part-0.parquet")]
    assert storage.read_json(join(root, "a/info.json")) == {"n": 1}
    assert storage.parquet_rows(join(root, "a/h=1/part-0.parquet")) == 3
    assert storage.read_parquet(join(root, "a/h=2/part-0.parquet"))["x"].to_pylist() == [4]
    storage.write_json(join(root, "a/info.json"), {"n": 2})  # replaced whole
    assert storage.read_json(join(root, "a/info.json")) == {"n": 2}
    assert storage.delete_file(join(root, "a/h=2/part-0.parquet")) and not storage.delete_file(join(root, "nope"))
    storage.delete_dir(join(root, "a"))
    storage.delete_dir(join(root, "never-was"))
    assert storage.files(root) == [] and not storage.is_dir(join(root, "a"))
    with pytest.raises(FileNotFoundError):
        storage.read_json(join(root, "a/info.json"))


def test_a_staged_batch_is_read_and_trimmed_in_a_bucket_as_on_a_disk(place):
    storage, root = place
    staging = join(root, "b1.1")
    spans = [{"topic": "t", "partition": 0, "start": 0, "end": 1000}, {"topic": "t", "partition": 1, "start": 0,
                                                                        "end": 500}]
    assert write_staging(staging, spans, layout="iceberg", files=3, storage=storage) == 15
    staged = StagedBatch.read(staging, storage)
    assert staged.name == "b1.1" and staged.row_count == 15 and len(staged.data_files()) == 3
    assert sum(staged.file_rows().values()) == 15
    staged.trim([Range("t", 0, 600, 1000), Range("t", 1, 0, 500)])
    again = StagedBatch.read(staging, storage)  # the counts file was rewritten too
    assert again.row_count == staged.row_count == len(offsets(600, 1000)) + len(offsets(0, 500))
    kept = {(p, o) for f in again.data_files() for p, o in zip(*(storage.read_parquet(f)[c].to_pylist()
                                                               for c in ("partition", "offset")))}
    assert kept == {(0, o) for o in offsets(600, 1000)} | {(1, o) for o in offsets(0, 500)}


def test_an_aws_connection_becomes_the_catalogs_s3_properties(monkeypatch):
    from airflow.providers.common.compat.sdk import AirflowException

    from airflow_provider_logbus.hooks.iceberg import IcebergCatalogHook

    monkeypatch.setenv("AIRFLOW_CONN_LAKE_KEYS", json.dumps({
        "conn_type": "aws", "login": ACCESS_KEY, "password": SECRET_KEY,
        "extra": {"region_name": REGION, "service_config": {"s3": {"endpoint_url": "http://minio:9000"}},
                  "aws_session_token": "tok"}}))
    monkeypatch.setenv("AIRFLOW_CONN_LAKE_CATALOG", json.dumps({
        "conn_type": "logbus_iceberg", "host": "postgresql+psycopg2://db/iceberg",
        "extra": {"warehouse": "s3://lake/wh", "aws_conn_id": "lake_keys", "s3.region": "eu-west-1"}}))
    props = IcebergCatalogHook("lake_catalog").catalog_properties()
    assert props == {"type": "sql", "uri": "postgresql+psycopg2://db/iceberg", "warehouse": "s3://lake/wh",
                     "s3.access-key-id": ACCESS_KEY, "s3.secret-access-key": SECRET_KEY, "s3.session-token": "tok",
                     "s3.endpoint": "http://minio:9000", "s3.region": "eu-west-1"}  # the catalog's own extra wins
    monkeypatch.setenv("AIRFLOW_CONN_LAKE_CATALOG", json.dumps({
        "conn_type": "logbus_iceberg", "host": "sqlite:////tmp/c.db", "extra": {"aws_conn_id": "missing_keys"}}))
    with pytest.raises(AirflowException, match="'missing_keys'.*not defined"):
        IcebergCatalogHook("lake_catalog").catalog_properties()


def test_a_warehouse_in_a_bucket_that_does_not_exist_fails_naming_it(s3_server, tmp_path):
    target = IcebergTarget("tbl", catalog_properties={**embedded_catalog(str(tmp_path)),
                                                      "warehouse": "s3://no-such-bucket/wh", **s3_server.properties()})
    with pytest.raises(TargetError, match="s3://no-such-bucket/wh.*bucket"):
        target.ensure_schema(pa.schema([pa.field("n", pa.int64())]))
    assert SECRET_KEY not in repr(target) and SECRET_KEY not in repr(target.storage)


def test_the_embedded_catalog_refuses_a_bucket_naming_the_connection_to_define(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TargetError, match="catalog connection"):
        IcebergTarget("tbl", warehouse="s3://lake/wh")
    assert list(tmp_path.iterdir()) == []  # once, a local directory `s3:/lake/wh` appeared here
