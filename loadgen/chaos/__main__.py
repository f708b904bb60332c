import sys

from kvroute.loadgen.chaos.cli import main

sys.exit(main())
