"""`bulkhead serve` with the fault injectors of tests/faults/harness.py at
the production seams: `python -m tests.faults.serve serve ARGS...`, with
BULKHEAD_FAULTS_FILE naming the file of armed faults. A `--role local`
router started this way starts its workers this way too."""

import sys

from bulkhead.cli import main
from tests.faults.harness import Injector

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], seams=Injector.from_env().seams()))
