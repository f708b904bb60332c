import sys

from kvroute.engine.service.cli import main

sys.exit(main())
