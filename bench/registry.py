"""What the schema registry answers per second (not a test): one `logbus
schema-registry` process on a private ZooKeeper (harness), asked over HTTP with one
keep-alive connection per client thread, as a serializer without its cache would:

- `GET /schemas/ids/{id}`: what a deserializer asks for each id it meets (one
  ZooKeeper read for the schema, one for its uses);
- `GET /subjects/{s}/versions/latest`: what `use.latest.version` asks;
- `POST /subjects/{s}/versions` of a new schema (BACKWARD, against the latest): a
  new id, its fingerprint, the version — and of an already registered one.

With HTTPS + Basic (`--secured`) each request also checks the password (SCRAM's
8192 iterations of PBKDF2, twice: every mechanism is tried) and reads the ACLs.

And (open registry only) the writer-schema lookups of a load's executor
(`spark/registry_schemas.py`, `writer_schema`, one per framed value): with the executor's
cache, and without it (the cache emptied before each lookup: a `GET /schemas/ids/{id}`
on a new connection, and the schema parsed, per value).

    .venv/bin/python -m bench.registry --requests 2000 --threads 1 4 [--secured]
"""

from __future__ import annotations

import argparse
import json
import ssl
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from kazoo.client import KazooClient

from broker.common.acls import AclEntry, Operation, Resource, ResourceType, change_acls
from broker.common.credentials import set_password
from harness.certificates import CertificateAuthority
from harness.registry import RegistryProcess
from harness.zookeeper import ZooKeeperServer


def record(i: int) -> str:
    """Schema i: any two are BACKWARD compatible (each field has a default)."""
    return json.dumps({"type": "record", "name": "Click", "fields": [
        {"name": "a", "type": "int", "default": 0}, {"name": f"id{i}", "type": "string", "default": ""}]})


def rate(clients: list[httpx.Client], requests: int, ask) -> float:
    """Requests per second, `requests` spread over the clients' threads; `ask(client, n)`
    with n unique across threads."""
    per = requests // len(clients)
    start = time.perf_counter()
    with ThreadPoolExecutor(len(clients)) as pool:
        list(pool.map(lambda k: [ask(clients[k], k * per + i) for i in range(per)], range(len(clients))))
    return per * len(clients) / (time.perf_counter() - start)


def ok(response: httpx.Response) -> None:
    if response.status_code != 200:
        raise RuntimeError(f"{response.status_code} {response.text}")


def executor_lookups(url: str, ids: list[int], requests: int) -> None:
    """Writer schemas found per second by a load's executor, one thread, with and
    without its cache."""
    from airflow_provider_logbus.registry_access import RegistryAccess
    from airflow_provider_logbus.spark import registry_schemas

    access = RegistryAccess(url)

    def uncached(i: int) -> None:
        registry_schemas._WRITER_SCHEMAS.clear()
        registry_schemas.writer_schema(access, ids[i % len(ids)])

    def cached(i: int) -> None:
        registry_schemas.writer_schema(access, ids[i % len(ids)])

    rates = {}
    for name, lookup, count in (("without", uncached, requests), ("with", cached, requests * 100)):
        start = time.perf_counter()
        for i in range(count):
            lookup(i)
        rates[name] = count / (time.perf_counter() - start)
    print(f"executor writer-schema lookups: with the cache {rates['with']:,.0f}/s, without {rates['without']:,.0f}/s")


def run(args: argparse.Namespace, workdir: Path) -> None:
    with ZooKeeperServer(workdir / "zookeeper") as zookeeper:
        connect = zookeeper.connect_string + "/bench"
        tls, auth, verify = None, None, True
        if args.secured:
            ca = CertificateAuthority(workdir / "ca")
            issued = ca.issue("127.0.0.1")
            tls, auth = (str(issued.certfile), str(issued.keyfile)), ("bench", "bench-secret")
            verify = ssl.create_default_context(cafile=str(ca.cafile))
            zk = KazooClient(connect)
            zk.start(30)
            zk.ensure_path("/")
            set_password(zk, "bench", "bench-secret")
            change_acls(zk, Resource(ResourceType.SUBJECT, "*"),
                        add=[AclEntry("User:bench", Operation.ALL)])
            zk.stop()
        registry = RegistryProcess(connect, workdir, tls=tls, basic_auth=args.secured).start()
        try:
            seed = httpx.Client(base_url=registry.url, verify=verify, auth=auth)
            ids = [seed.post(f"/subjects/s{i}/versions", json={"schema": record(i)}).json()["id"] for i in range(50)]
            for threads in args.threads:
                clients = [httpx.Client(base_url=registry.url, verify=verify, auth=auth) for _ in range(threads)]
                by_id = rate(clients, args.requests, lambda c, i: ok(c.get(f"/schemas/ids/{ids[i % 50]}")))
                latest = rate(clients, args.requests, lambda c, i: ok(c.get(f"/subjects/s{i % 50}/versions/latest")))
                again = rate(clients, args.requests // 4,
                             lambda c, i: ok(c.post(f"/subjects/s{i % 50}/versions", json={"schema": record(i % 50)})))
                offset = threads * 1_000_000  # each round's schemas are new
                new = rate(clients, args.requests // 4, lambda c, i: ok(c.post(
                    "/subjects/evolving/versions", json={"schema": record(offset + i)})))
                print(f"threads={threads}: GET /schemas/ids {by_id:,.0f}/s, GET latest {latest:,.0f}/s, "
                      f"register known {again:,.0f}/s, register new {new:,.0f}/s")
                for client in clients:
                    client.close()
            if not args.secured:
                executor_lookups(registry.url, ids, args.requests)
        finally:
            registry.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--secured", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="logbus-bench-registry-") as workdir:
        run(args, Path(workdir))


if __name__ == "__main__":
    main()
