"""`python -m bulkhead ...` runs the `bulkhead` command, for a venv whose bin/ is not on PATH."""

import sys

from bulkhead.cli import main

sys.exit(main())
