"""``python -m grader``: see grader/README.md."""

import sys

from grader.cli import main

sys.exit(main())
