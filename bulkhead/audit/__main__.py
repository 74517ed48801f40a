"""`python -m bulkhead.audit plan|preflight ...`"""

import sys

from bulkhead.audit.cli import main

if __name__ == "__main__":
    sys.exit(main())
