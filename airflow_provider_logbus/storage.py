"""Files where a table keeps them — a local or shared disk, or an object store — through
`pyarrow.fs` (docs/provider.md, "Object storage").

Every file the load, the commit and the maintenance touch outside the catalog (staging,
the counts and error files, the trim, the removal of other attempts, the audit reports,
orphans) goes through `Storage`, so one code path serves `/data/wh` and
`s3://bucket/wh`. A location is a plain string: a local path, or a URI whose scheme
pyarrow reaches (`s3://`, `gs://`, `abfs://`).

Object-store settings are pyiceberg's catalog property names (`s3.endpoint`,
`s3.access-key-id`, `s3.secret-access-key`, `s3.session-token`, `s3.region`), so the
catalog and the files read the same settings. They reach the load job in the environment
variable `LOGBUS_STORAGE` (never its command line), and its executors as a data source
option; without settings pyarrow uses the AWS SDK's own chain (environment, profile,
instance role).
"""

from __future__ import annotations

import json
import os
import uuid
from typing import Any, Mapping

STORAGE_ENV = "LOGBUS_STORAGE"
S3_PROPERTIES = ("s3.endpoint", "s3.access-key-id", "s3.secret-access-key", "s3.session-token", "s3.region")
SECRET_PROPERTIES = ("s3.secret-access-key", "s3.session-token")


class StorageError(RuntimeError):
    """A location cannot be reached; the message names it and why."""


def storage_properties(properties: Mapping[str, Any] | None) -> dict[str, str]:
    """The object-store settings among catalog `properties`."""
    return {k: str(v) for k, v in (properties or {}).items() if k in S3_PROPERTIES and v not in (None, "")}


def properties_from_environment() -> dict[str, str]:
    """The settings the operator handed the load job (`STORAGE_ENV`)."""
    raw = os.environ.get(STORAGE_ENV)
    return storage_properties(json.loads(raw)) if raw else {}


def is_uri(location: str | os.PathLike) -> bool:
    """An object store's location (a local path and `file://` are not)."""
    location = os.fspath(location)
    return "://" in location and not location.startswith("file://")


def join(location: str | os.PathLike, *names: str) -> str:
    return "/".join([str(location).rstrip("/"), *(n.strip("/") for n in names)])


def name_of(location: str | os.PathLike) -> str:
    return str(location).rstrip("/").rsplit("/", 1)[-1]


def parent_of(location: str | os.PathLike) -> str:
    return str(location).rstrip("/").rsplit("/", 1)[0]


class Storage:
    """One filesystem per scheme for a set of settings; all paths in and out are
    locations (local paths stay local paths, URIs stay URIs)."""

    def __init__(self, properties: Mapping[str, Any] | None = None) -> None:
        self.properties = storage_properties(properties)
        self._s3 = None

    def __repr__(self) -> str:  # never the secrets
        return f"Storage(endpoint={self.properties.get('s3.endpoint')!r})"

    # ----------------------------------------------------------------- locations

    def resolve(self, location: str):
        """(pyarrow filesystem, path inside it)."""
        from pyarrow.fs import FileSystem, LocalFileSystem

        location = os.fspath(location)
        if location.startswith("file://"):
            location = location[len("file://"):]
        if "://" not in location:
            return LocalFileSystem(), location
        scheme, _, rest = location.partition("://")
        if scheme in ("s3", "s3a"):
            return self._s3_filesystem(), rest
        return FileSystem.from_uri(location)

    def _s3_filesystem(self):
        from pyarrow.fs import S3FileSystem

        if self._s3 is None:
            p = self.properties
            options: dict[str, Any] = {}
            endpoint = p.get("s3.endpoint")
            if endpoint:
                scheme, _, host = endpoint.partition("://") if "://" in endpoint else ("https", "", endpoint)
                options.update(endpoint_override=host.rstrip("/"), scheme=scheme)
            if p.get("s3.access-key-id"):
                options.update(access_key=p["s3.access-key-id"], secret_key=p.get("s3.secret-access-key"),
                               session_token=p.get("s3.session-token"))
            if p.get("s3.region"):
                options["region"] = p["s3.region"]
            self._s3 = S3FileSystem(**options)
        return self._s3

    @staticmethod
    def location_of(like: str, path: str) -> str:
        """`path` inside the filesystem of location `like`, in `like`'s form."""
        if is_uri(like):
            return f"{like.split('://', 1)[0]}://{path}"
        return path

    # ----------------------------------------------------------------- reading

    def exists(self, location: str) -> bool:
        from pyarrow.fs import FileType

        fs, path = self.resolve(location)
        return fs.get_file_info(path).type != FileType.NotFound

    def is_dir(self, location: str) -> bool:
        """A directory, or (object store) a prefix holding at least one object."""
        from pyarrow.fs import FileType

        fs, path = self.resolve(location)
        return fs.get_file_info(path.rstrip("/")).type == FileType.Directory

    def files(self, location: str, suffix: str = "", recursive: bool = True) -> list[str]:
        """Files under `location` whose name ends with `suffix` (none when it is absent),
        sorted."""
        from pyarrow.fs import FileSelector, FileType

        fs, path = self.resolve(location)
        infos = fs.get_file_info(FileSelector(path.rstrip("/"), recursive=recursive, allow_not_found=True))
        return sorted(self.location_of(location, i.path) for i in infos
                      if i.type == FileType.File and i.base_name.endswith(suffix))

    def entries(self, location: str, recursive: bool = False) -> list:
        """pyarrow `FileInfo`s under `location` (none when it is absent); their paths are
        inside the filesystem (`location_of` turns one back into a location)."""
        from pyarrow.fs import FileSelector

        fs, path = self.resolve(location)
        return fs.get_file_info(FileSelector(path.rstrip("/"), recursive=recursive, allow_not_found=True))

    def read_bytes(self, location: str) -> bytes:
        fs, path = self.resolve(location)
        with fs.open_input_stream(path) as stream:
            return stream.read()

    def read_json(self, location: str):
        return json.loads(self.read_bytes(location))

    def parquet_rows(self, location: str) -> int:
        import pyarrow.parquet as pq

        fs, path = self.resolve(location)
        with fs.open_input_file(path) as f:
            return pq.ParquetFile(f).metadata.num_rows

    def read_parquet(self, location: str, columns: list[str] | None = None):
        """One file alone (Hive partition columns stay in its path)."""
        import pyarrow.parquet as pq

        fs, path = self.resolve(location)
        with fs.open_input_file(path) as f:
            return pq.read_table(f, columns=columns)

    # ----------------------------------------------------------------- writing

    def write_bytes(self, location: str, data: bytes, tmp_dir: str | None = None) -> None:
        """Readers see the old file or the new one, never half: on a disk through a
        temporary file (in `tmp_dir`, default beside the target, so a writer killed
        mid-way leaves nothing inside a directory about to be published) renamed over
        the target; on an object store one PUT already is all or nothing. On a disk the
        directory must exist: a staging directory a concurrent commit removed must not
        come back holding one file."""
        fs, path = self.resolve(location)
        if is_uri(location):
            with fs.open_output_stream(path) as stream:
                stream.write(data)
            return
        tmp = os.path.join(tmp_dir or os.path.dirname(path), f".{os.path.basename(path)}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:  # e.g. the directory removed meanwhile by a concurrent commit
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise

    def write_json(self, location: str, obj, tmp_dir: str | None = None) -> None:
        self.write_bytes(location, json.dumps(obj, indent=1, sort_keys=True).encode(), tmp_dir)

    def write_parquet(self, location: str, table) -> None:
        """Replace one Parquet file, atomically as `write_bytes`."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        sink = pa.BufferOutputStream()
        pq.write_table(table, sink)
        self.write_bytes(location, sink.getvalue().to_pybytes())

    def make_dirs(self, location: str) -> None:
        """A directory on a disk; nothing on an object store (prefixes need no marker)."""
        if not is_uri(location):
            fs, path = self.resolve(location)
            fs.create_dir(path, recursive=True)

    def delete_file(self, location: str) -> bool:
        fs, path = self.resolve(location)
        try:
            fs.delete_file(path)
            return True
        except FileNotFoundError:
            return False

    def delete_dir(self, location: str) -> None:
        """The tree under `location`, if any."""
        fs, path = self.resolve(location)
        try:
            fs.delete_dir(path.rstrip("/"))
        except FileNotFoundError:
            pass
