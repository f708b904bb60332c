import sys

from router.service.cli import main

sys.exit(main())
