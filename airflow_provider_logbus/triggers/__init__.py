"""logbus provider triggers."""
