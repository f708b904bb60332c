"""Every planted bug (kvroute/scripts/planted_bugs.toml, docs/mutation.md) still names code that is in
the tree exactly once, and tests that exist: a refactor that moves the code is caught here, not when
someone next runs the planting (minutes per bug)."""

import pathlib

from kvroute.scripts.planted_bugs import line_of, load_bugs

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_each_bug_names_code_that_occurs_once():
    stale = []
    for bug in load_bugs():
        try:
            line_of(bug, ROOT)
        except (ValueError, FileNotFoundError) as e:
            stale.append(str(e))
    assert not stale


def test_each_bugs_tests_are_files_of_the_suite():
    missing = {t for bug in load_bugs() for t in bug.tests if not (ROOT / t.split("::")[0]).exists()}
    assert not missing
