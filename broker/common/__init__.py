"""The contracts the server and every client share (docs/architecture.md, "Layers"):
the wire protocol, the message format, the error codes, the ZooKeeper layout and the
partition-state view. They import nothing else of the project; changing one changes
what is on the wire or in ZooKeeper."""
