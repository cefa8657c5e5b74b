"""What the tests share: the CuPy stand-in, memory checks, the loopback S3 server, the CLI with test
hooks, hostile-input helpers, the tolerances of the error analysis, and the distributed workers' probe."""
