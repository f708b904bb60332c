import sys

from kvroute.router.service.cli import main

sys.exit(main())
