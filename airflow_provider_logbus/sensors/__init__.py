"""logbus provider sensors."""
