import sys

from kvroute.loadgen.cli import main

sys.exit(main())
