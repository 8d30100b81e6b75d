"""The Kafka API keys and versions the Kafka listener serves (docs/kafka.md, "APIs and
versions"): what it answers ApiVersions with, so what clients negotiate.

Each range reaches down to the lowest version one of the clients tested needs
(aiokafka 0.14 picks versions from its own fixed classes: Produce up to v7, Fetch up
to v11, Metadata up to v5, ...) and up to the highest one without what logbus does
not have (topic ids: Produce v13, Fetch v13, Metadata's by-id lookups; KIP-890's
transactions v2: Produce v12 and InitProducerId v6 are the same messages otherwise).
The floors are Kafka 4.0's, which kio (the codec) follows: versions Kafka 4.0
removed (KIP-896) are not served here either, and the clients tested negotiate
above them. A request outside these ranges is refused with UNSUPPORTED_VERSION.
"""

from __future__ import annotations

import enum


class ApiKey(enum.IntEnum):
    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    INIT_PRODUCER_ID = 22
    DESCRIBE_CONFIGS = 32
    SASL_AUTHENTICATE = 36


API_VERSIONS = int(ApiKey.API_VERSIONS)
CONTROLLED_SHUTDOWN = 7  # the one request with header v0 (v0 of it); not served

# (min, max) per key, the ApiVersions answer.
SERVED: dict[int, tuple[int, int]] = {
    ApiKey.PRODUCE: (3, 11),
    ApiKey.FETCH: (4, 12),
    ApiKey.LIST_OFFSETS: (1, 8),
    ApiKey.METADATA: (0, 12),
    ApiKey.OFFSET_COMMIT: (2, 9),
    ApiKey.OFFSET_FETCH: (1, 8),
    ApiKey.FIND_COORDINATOR: (0, 4),
    ApiKey.JOIN_GROUP: (0, 9),
    ApiKey.HEARTBEAT: (0, 4),
    ApiKey.LEAVE_GROUP: (0, 5),
    ApiKey.SYNC_GROUP: (0, 5),
    ApiKey.DESCRIBE_GROUPS: (0, 5),
    ApiKey.LIST_GROUPS: (0, 4),
    ApiKey.SASL_HANDSHAKE: (1, 1),  # v0: unframed SASL tokens after it, not read here
    ApiKey.API_VERSIONS: (0, 3),
    ApiKey.CREATE_TOPICS: (2, 7),
    ApiKey.DELETE_TOPICS: (1, 5),
    ApiKey.INIT_PRODUCER_ID: (0, 5),
    ApiKey.DESCRIBE_CONFIGS: (1, 4),
    ApiKey.SASL_AUTHENTICATE: (0, 2),
}


def served(api_key: int, api_version: int) -> bool:
    """Whether the listener answers this key at this version (else UNSUPPORTED_VERSION)."""
    bounds = SERVED.get(api_key)
    return bounds is not None and bounds[0] <= api_version <= bounds[1]
