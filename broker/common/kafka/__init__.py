"""The Kafka protocol's codecs (docs/kafka.md): a second front end over the same log.
`frames` (size prefix, request and response headers, API messages through kio),
`apis` (the API keys and versions the Kafka listener serves), `records` (Kafka's
RecordBatch v2: the broker's checks on produce, the magic-4 entry that stores a batch
verbatim), `fetch` (stored entries as Kafka batches, a stored batch's records for
native readers)."""
