import sys

from loadgen.chaos.cli import main

sys.exit(main())
