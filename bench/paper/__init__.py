"""The Kafka paper's experiments (NetDB 2011, §4) on logbus and its peers: `python -m bench.paper`."""
