"""Peer brokers for bench.paper: RabbitMQ, ActiveMQ, Redis Streams — server lifecycle and Python drivers."""
