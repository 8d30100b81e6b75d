"""ZooKeeper credentials and node ACLs (docs/zookeeper.md, "Who may change what"; Kafka's
`zookeeper.set.acl`), shared by brokers and the `logbus` command so that both create
nodes the same way.

The model: brokers and operators' tools share one digest identity (user:password);
the nodes they create are readable by anyone and writable by that identity; SCRAM
credentials are readable only by it; the consumer groups' subtree (`/consumers`) and
the mirrors' checkpoints stay open, because clients create them — a group's offsets
there are advisory, and the provider's committed offsets live in the table, not in
ZooKeeper.

A node's own ACL does not guard its removal: ZooKeeper checks a delete, and a create,
against the *parent's* ACL. So the cluster's root — the chroot of its connect string —
must be the cluster's too (`protect_root`), or anyone could delete or replace the
nodes kept there (`/controller`, `/latest_producer_id_block`, ...)."""

from __future__ import annotations

from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, NodeExistsError, NoNodeError
from kazoo.security import ACL, OPEN_ACL_UNSAFE, Permissions, make_acl, make_digest_acl, make_digest_acl_credential

NO_CHROOT = (
    "the cluster's nodes are at ZooKeeper's own root, which is shared and not the cluster's to protect: anyone who "
    "reaches ZooKeeper may delete or replace /controller, /controller_epoch or /latest_producer_id_block, and create "
    "nodes beside them (ZooKeeper checks a delete or a create against the parent's ACL). Move the cluster under a "
    "chroot of its own: stop the brokers, run `logbus --zookeeper HOST:PORT/logbus --command-config admin.properties "
    "zookeeper protect-root --copy-from /`, and start them with zookeeper.connect=HOST:PORT/logbus "
    "(docs/operations.md, \"Protecting the ZooKeeper root\")")
# what an ACL entry on the root must grant no one but the cluster: creating or deleting
# its children, and changing the root's own ACL
_ROOT_POWERS = Permissions.CREATE | Permissions.DELETE | Permissions.ADMIN


class UnprotectedRoot(ValueError):
    """The cluster's ZooKeeper root is not its own and cannot be made so from here; the
    message names what to do."""


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
        # how ZooKeeper names this identity in ACLs: user:base64(sha1(user:password))
        self.identity = make_digest_acl_credential(user, password) if digest else ""
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


def root_openings(acl: list[ACL], identity: str) -> list[str]:
    """Who, besides the cluster's `identity`, the root's ACL lets create or delete the
    nodes under it or change its ACL, as "scheme:id (PERMS)"; empty: the root is the
    cluster's own."""
    return [f"{entry.id.scheme}:{entry.id.id} ({','.join(entry.acl_list)})" for entry in acl
            if entry.perms & _ROOT_POWERS and (entry.id.scheme, entry.id.id) != ("digest", identity)]


def protect_root(zk: KazooClient, auth: ZooKeeperAuth, chroot: str = "") -> str:
    """Make the cluster's ZooKeeper root its own: create it, or set its ACL, so that
    only `auth`'s identity may create or delete the nodes under it (anyone may read).
    The root is `zk`'s chroot, or `chroot` (a path of `zk`) for a client outside it.
    What was done, for the log ("" when it already was); `UnprotectedRoot` when there
    is no chroot (ZooKeeper's own root is shared: not the cluster's to change) or the
    identity may not change the root's ACL."""
    if not auth.enabled:
        raise UnprotectedRoot("protecting the ZooKeeper root needs the cluster's identity: "
                              "zookeeper.auth=user:password and zookeeper.set.acl=true")
    name, path = (chroot, chroot) if chroot else (zk.chroot, "/")
    if not name:
        raise UnprotectedRoot(NO_CHROOT)
    if zk.exists(path) is None:
        try:
            zk.create(path, b"", acl=auth.default_acl)
            return f"created the cluster's ZooKeeper root {name}: only the cluster's identity may change it"
        except NodeExistsError:
            pass  # another broker's, a moment ago
        except (NoNodeError, NoAuthError):
            raise UnprotectedRoot(f"cannot create the cluster's ZooKeeper root {name}: its parent is missing or closed "
                                  f"to the cluster's identity; create {name} first") from None
    try:
        current, _ = zk.get_acls(path)
        open_to = root_openings(current, auth.identity)
        if open_to:
            zk.set_acls(path, auth.default_acl)
    except NoAuthError:
        raise UnprotectedRoot(f"the cluster's identity ({auth.digest.split(':')[0]}) may not read or change the ACL "
                              f"of its ZooKeeper root {name}: give it ADMIN there") from None
    if not open_to:
        return ""
    return (f"the cluster's ZooKeeper root {name} let {', '.join(open_to)} create or delete the nodes under it: "
            "now only the cluster's identity may (anyone may read)")
