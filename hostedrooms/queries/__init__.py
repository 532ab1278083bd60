"""Read-only queries: what the reporting faces (the console script, status, verify) read and never write."""
