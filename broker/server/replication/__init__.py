"""Replication (docs/replication.md): leaders, followers, in-sync replicas, the high
watermark. `manager` learns roles from ZooKeeper's partition state nodes, `partition`
keeps one partition's leader/follower state, `fetcher` is a follower's fetch loop."""
