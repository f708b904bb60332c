import sys

from kvroute.engine.service.cli import main
from kvroute.router.contract.interrupt import run_command

sys.exit(run_command("kvroute engine", main))
