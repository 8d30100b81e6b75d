"""The broker process (docs/architecture.md, "Layers"): the network server, request
handlers, registration and the controller, replication and the log. It imports the
contracts (`broker.common`) and nothing of the clients, the tools or the provider."""
