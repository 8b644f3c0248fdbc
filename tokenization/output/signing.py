"""Signatures of what the tokenization cache writes, with a key the deployment holds.

The sha256s an entry's marker lists catch damage, never intent: whoever can write the cache's folder can write an
entry whose files, sha256s and counts agree. A signature cannot be written without the key, which builds read
from ``TOKENIZATION_CACHE_KEY`` in their environment (set it on every worker, from the deployment's secrets: an
Airflow connection's password, a secrets backend), the way Nix signs what its binary caches serve. With a key, a
marker that is not signed with it is a miss, named in the log; without one, markers are neither signed nor
checked, and a hit is held against its input file instead (``stages.hits``).
"""

from __future__ import annotations

import hashlib
import hmac
import os

KEY_SETTING = "TOKENIZATION_CACHE_KEY"
SCHEME = "hmac-sha256:"


class Signer:
    """Signs and verifies bytes with one key (HMAC-SHA256)."""

    def __init__(self, key: bytes):
        self._key = key

    @classmethod
    def from_environment(cls) -> Signer | None:
        """The deployment's signer, or None when it sets no key."""
        key = os.environ.get(KEY_SETTING, "")
        return cls(key.encode()) if key else None

    def sign(self, data: bytes) -> str:
        return SCHEME + hmac.new(self._key, data, hashlib.sha256).hexdigest()

    def problem(self, data: bytes, signature: str | None) -> str | None:
        """Why ``signature`` is not this key's of ``data``, or None when it is."""
        if signature is None:
            return f"it is not signed, and this build signs with {KEY_SETTING}"
        if not hmac.compare_digest(signature, self.sign(data)):
            return f"its signature does not verify with {KEY_SETTING} (signed with another key, or changed since)"
        return None
