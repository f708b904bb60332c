import sys

from kvroute.loadgen.cli import main
from kvroute.router.contract.interrupt import run_command

sys.exit(run_command("kvroute loadgen", main))
