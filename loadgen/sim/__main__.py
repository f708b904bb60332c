import sys

from kvroute.loadgen.sim import main

sys.exit(main())
