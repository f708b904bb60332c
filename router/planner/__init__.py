"""The online prefill:decode planner: `decide.py` (the decision, pure), `service.py` (driving a
router over HTTP), `cli.py` (`kvroute planner`). The simulator runs `decide.py` too."""
