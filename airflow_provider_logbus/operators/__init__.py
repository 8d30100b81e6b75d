"""logbus provider operators."""
