"""``python -m crawlproject.cli``."""

import sys

from crawlproject.cli import main

sys.exit(main())
