"""Refuse to start the compose deployment with the placeholder secrets of .env.example (or none at all).

airflow-init runs this first; every Airflow service waits for airflow-init to succeed, so a stack whose .env still
says change-me never starts. Exit 1 names every secret to change; exit 0 prints nothing.
"""

from __future__ import annotations

import base64
import binascii
import os
import sys

SECRETS = {  # name -> shortest acceptable value
    "AIRFLOW__CORE__FERNET_KEY": 44,
    "AIRFLOW__API_AUTH__JWT_SECRET": 32,
    "AIRFLOW_ADMIN_PASSWORD": 12,
    "S3_SECRET_ACCESS_KEY": 12,
}
PLACEHOLDER = "change-me"


def problems(env: dict[str, str]) -> list[str]:
    found = []
    for name, shortest in SECRETS.items():
        value = env.get(name, "")
        if not value or PLACEHOLDER in value:
            found.append(f"{name} is {'unset' if not value else 'the placeholder of .env.example'}")
        elif len(value) < shortest:
            found.append(f"{name} is shorter than {shortest} characters")
    fernet = env.get("AIRFLOW__CORE__FERNET_KEY", "")
    if fernet and PLACEHOLDER not in fernet and not _is_fernet_key(fernet):
        found.append("AIRFLOW__CORE__FERNET_KEY is not a Fernet key (32 url-safe base64-encoded bytes)")
    return found


def _is_fernet_key(value: str) -> bool:
    try:
        return len(base64.urlsafe_b64decode(value.encode())) == 32
    except (binascii.Error, ValueError):
        return False


if __name__ == "__main__":
    found = problems(dict(os.environ))
    for line in found:
        print(f"refusing to start: {line}; set it in .env (see .env.example for how to make one)", file=sys.stderr)
    sys.exit(1 if found else 0)
