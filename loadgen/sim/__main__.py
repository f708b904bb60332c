import sys

from loadgen.sim import main

sys.exit(main())
