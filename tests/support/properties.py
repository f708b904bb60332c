"""Settings for the property tests (hypothesis): the same examples on every run, no example database.

`derandomize` makes each run draw the same examples (a failure reproduces, CI never flakes on a
new draw); `database=None` keeps no failing examples between runs (hypothesis still caches the
source's constants in `.hypothesis/`, which git ignores).
"""

from hypothesis import HealthCheck, settings

PROPERTY = settings(derandomize=True, database=None, deadline=None, max_examples=200,
                    suppress_health_check=[HealthCheck.too_slow])
FEW = settings(PROPERTY, max_examples=60)  # for examples that each run a scheduler or a simulation
