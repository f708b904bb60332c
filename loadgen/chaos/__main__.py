import sys

from kvroute.loadgen.chaos.cli import main
from kvroute.router.contract.interrupt import run_command

sys.exit(run_command("kvroute chaos", main))
