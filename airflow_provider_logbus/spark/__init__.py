"""Spark side of the provider: the `logbus` Python data source and the load job."""
