"""``python -m tokenization.builds BUILDS_FOLDER``: the summary of the newest complete build, the one ``LATEST``
names; a folder, ``LATEST`` or record that cannot be used is one line naming the file."""

import sys

from tokenization.builds.complete import latest_build, summary
from tokenization.errors import TokenizationError

if len(sys.argv) != 2:
    sys.exit("usage: python -m tokenization.builds BUILDS_FOLDER")
try:
    print(summary(latest_build(sys.argv[1])))
except TokenizationError as exc:
    sys.exit(f"error: {exc}")
