"""A real S3 API server on loopback for the storage tests (moto in server mode, dummy credentials)."""

from __future__ import annotations

import uuid

import pytest


@pytest.fixture(scope="session")
def s3_server():
    """Start moto's S3 server on 127.0.0.1 (a free port) once per session; yields its storage options."""
    pytest.importorskip("s3fs")
    server_mod = pytest.importorskip("moto.server")
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    import logging

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one log line per request otherwise
    server.start()
    host, port = server.get_host_and_port()
    options = {"key": "testing", "secret": "testing", "endpoint_url": f"http://{host}:{port}"}
    yield options
    server.stop()


@pytest.fixture
def s3(s3_server):
    """A fresh bucket: ``(url_prefix, storage_options)``."""
    import s3fs

    fs = s3fs.S3FileSystem(**s3_server)
    bucket = f"blocklin-{uuid.uuid4().hex[:10]}"
    fs.mkdir(bucket)
    return f"s3://{bucket}", dict(s3_server)
