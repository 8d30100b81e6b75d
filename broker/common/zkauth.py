"""ZooKeeper credentials and node ACLs (docs/zookeeper.md, "Who may change what"; Kafka's
`zookeeper.set.acl`), shared by brokers and the `logbus` command so that both create
nodes the same way.

The model: brokers and operators' tools share one digest identity (user:password);
the nodes they create are readable by anyone and writable by that identity; SCRAM
credentials are readable only by it; the consumer groups' subtree (`/consumers`) and
the mirrors' checkpoints stay open, because clients create them — a group's offsets
there are advisory, and the provider's committed offsets live in the table, not in
ZooKeeper."""

from __future__ import annotations

from kazoo.security import OPEN_ACL_UNSAFE, make_acl, make_digest_acl


class ZooKeeperAuth:
    """`digest` is "user:password" (or empty: no identity); `set_acl` makes the nodes we
    create writable by that identity only. With `tls_cafile`, ZooKeeper is reached over
    TLS (its `secureClientPort`), its certificate checked against that CA; a client
    certificate (`tls_certfile`, `tls_keyfile`) if ZooKeeper asks for one."""

    def __init__(self, digest: str = "", set_acl: bool = False, tls_cafile: str = "", tls_certfile: str = "",
                 tls_keyfile: str = "") -> None:
        self.tls_cafile, self.tls_certfile, self.tls_keyfile = tls_cafile, tls_certfile, tls_keyfile
        if set_acl and not digest:
            raise ValueError("ZooKeeper ACLs need a digest identity (user:password)")
        if digest and ":" not in digest:
            raise ValueError("the ZooKeeper identity must be user:password")
        self.digest = digest
        self.enabled = set_acl
        user, _, password = digest.partition(":")
        if set_acl:
            self.default_acl = [make_digest_acl(user, password, all=True), make_acl("world", "anyone", read=True)]
            self.private_acl = [make_digest_acl(user, password, all=True)]
            self.open_acl = OPEN_ACL_UNSAFE
        else:
            self.default_acl = self.private_acl = self.open_acl = None

    def client_kwargs(self) -> dict:
        """What `KazooClient` takes to authenticate and to create nodes with our ACL."""
        kwargs: dict = {}
        if self.tls_cafile:
            kwargs.update(use_ssl=True, verify_certs=True, ca=self.tls_cafile)
            if self.tls_certfile:
                kwargs.update(certfile=self.tls_certfile, keyfile=self.tls_keyfile)
        if self.digest:
            kwargs["auth_data"] = [("digest", self.digest)]
        if self.default_acl:
            kwargs["default_acl"] = self.default_acl
        return kwargs


NO_AUTH = ZooKeeperAuth()
