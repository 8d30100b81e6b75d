"""logbus clients: connections, producer, consumers, consumer groups."""
