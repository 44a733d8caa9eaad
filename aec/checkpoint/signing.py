"""Signed checkpoint manifests: HMAC-SHA256 with a key from the environment.

With ``AEC_CHECKPOINT_KEY`` set (any non-empty string; its UTF-8 bytes are the
key), every checkpoint written gets ``MANIFEST.hmac`` beside its manifest:
``hmac-sha256:<hex>`` of the manifest's exact bytes. It is written before the
manifest (the manifest stays the commit). The manifest holds every other file's
size and SHA-256, so the signature covers every byte of the checkpoint.

A restore with the key set reads the manifest's bytes and checks the signature
before it parses anything: a checkpoint without a signature, or with one made
with another key (or over other bytes), is refused with ``ValueError`` before
any byte of it is decoded. Without the key set, signatures are not checked
(and not required): the checksums still detect corruption, not tampering.

The variable is read when a checkpoint is written or read, so a job and its
restarts must all see it (on Spark: the executors' environment, e.g.
``spark.executorEnv.AEC_CHECKPOINT_KEY``). A signature binds the manifest, not
the location: a signed checkpoint copied elsewhere (or an older one put in a
newer one's place) still verifies; restore by ``CheckpointHandle`` to have its
id checked.
"""

from __future__ import annotations

import hashlib
import hmac
import os

KEY_VARIABLE = "AEC_CHECKPOINT_KEY"
SIGNATURE = "MANIFEST.hmac"
_SCHEME = b"hmac-sha256:"


def current_key() -> bytes | None:
    """The signing key from ``AEC_CHECKPOINT_KEY`` (None when unset or empty)."""
    value = os.environ.get(KEY_VARIABLE, "")
    return value.encode("utf-8") if value else None


def sign(manifest: bytes, key: bytes) -> bytes:
    """The contents of ``MANIFEST.hmac`` for ``manifest``'s bytes."""
    return _SCHEME + hmac.new(key, manifest, hashlib.sha256).hexdigest().encode()


def check(
    where: str,
    manifest: bytes,
    signature: bytes | None,
    key: bytes | None,
    signature_file: str = SIGNATURE,
) -> None:
    """Check ``signature`` (the bytes of ``signature_file``, ``MANIFEST.hmac`` by
    default, None when absent) against ``manifest``'s bytes (or another signed file's)
    with ``key``; nothing to check without a key.

    Raises ValueError naming ``where`` (the checkpoint): unsigned, or a signature
    that does not match (another key, or changed bytes).
    """
    if key is None:
        return
    if signature is None:
        raise ValueError(
            f"{where} is not signed ({signature_file} is missing) but {KEY_VARIABLE} is set: "
            "refusing a checkpoint not written by a holder of the key"
        )
    expected = sign(manifest, key)
    if not hmac.compare_digest(expected, signature.strip()):
        raise ValueError(
            f"{where}: the signature ({signature_file}) does not match {KEY_VARIABLE}: "
            "it was changed, or written with another key; refusing it"
        )
