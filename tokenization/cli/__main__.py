"""``python -m tokenization.cli``: the command line, as the ``tokenization`` program runs it."""

import sys

from tokenization.cli import main

sys.exit(main())
