import sys

from bulkhead.cli import main

sys.exit(main(["sim", *sys.argv[1:]]))
