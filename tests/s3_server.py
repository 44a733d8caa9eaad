"""A real S3 API server on loopback for object-store tests: moto in server mode.

``S3Server.start()`` runs ``python -m moto.server`` as a separate process on a
free loopback port and waits until it answers; ``stop()`` ends that process by
its PID (never by name). ``environ(bucket)`` gives the standard AWS variables
that point a client (pyarrow.fs, fsspec/s3fs, boto3, SlateDB) at it.

The ``s3`` fixture in ``conftest.py`` starts one server per test session and
gives each test a fresh bucket with the AWS variables set for the test only.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid

ACCESS_KEY = "testing"
SECRET_KEY = "testing"
REGION = "us-east-1"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class S3Server:
    """One moto server process on 127.0.0.1."""

    def __init__(self) -> None:
        self.port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> S3Server:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"moto server exited with {self.process.returncode}")
            try:
                urllib.request.urlopen(self.endpoint + "/moto-api/", timeout=1).close()
                return self
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"moto server did not answer on {self.endpoint}") from None
                time.sleep(0.1)

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        os.kill(process.pid, signal.SIGCONT)  # a paused server would not hear SIGTERM
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)

    def environ(self) -> dict[str, str]:
        """The AWS variables that point clients at this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": REGION,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_ALLOW_HTTP": "true",  # SlateDB's object_store crate refuses http otherwise
        }

    def client(self):
        """A boto3 S3 client of this server."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name=REGION,
        )

    def create_bucket(self, name: str | None = None) -> str:
        """A new, empty bucket; its name."""
        name = name or f"aec-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def delete_bucket(self, bucket: str) -> None:
        """Delete every object of ``bucket``, then the bucket."""
        client = self.client()
        for key in self.list_keys(bucket):
            client.delete_object(Bucket=bucket, Key=key)
        client.delete_bucket(Bucket=bucket)

    def get_object(self, bucket: str, key: str) -> bytes:
        return self.client().get_object(Bucket=bucket, Key=key)["Body"].read()

    def put_object(self, bucket: str, key: str, body: bytes) -> None:
        self.client().put_object(Bucket=bucket, Key=key, Body=body)

    def pause(self) -> None:
        """Stop the server process (SIGSTOP by its PID): connections are accepted by
        the kernel and never answered, a stalled store."""
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """Let a paused server go on (SIGCONT by its PID)."""
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGCONT)

    def list_keys(self, bucket: str, prefix: str = "") -> list[str]:
        """Every object key under ``prefix`` in ``bucket``, sorted."""
        client = self.client()
        keys: list[str] = []
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            keys += [item["Key"] for item in page.get("Contents", [])]
        return sorted(keys)


def environ_without_aws() -> dict[str, str]:
    """``os.environ`` less every AWS variable (for subprocesses that must not see S3)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
