"""`python -m bulkhead.audit plan|preflight|probe ...`"""

import sys

from bulkhead.audit.cli import main

if __name__ == "__main__":
    sys.exit(main())
