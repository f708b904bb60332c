import sys

from kvroute.router.contract.interrupt import run_command
from kvroute.router.service.cli import main

sys.exit(run_command("kvroute router", main))
