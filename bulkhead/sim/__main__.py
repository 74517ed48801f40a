import sys

from bulkhead.sim.cli import main

sys.exit(main())
