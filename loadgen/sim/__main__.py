import sys

from kvroute.loadgen.sim import main
from kvroute.router.contract.interrupt import run_command

sys.exit(run_command("kvroute sim", main))
