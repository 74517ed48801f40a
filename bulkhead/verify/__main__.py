import sys

from bulkhead.verify.cli import main

sys.exit(main())
