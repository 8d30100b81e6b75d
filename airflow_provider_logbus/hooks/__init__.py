"""logbus provider hooks."""
