"""The mypyc probe (kvroute/benchmarks/compiled_decision.py) changes a copy of the decision modules only as mypyc
needs: every class it names is still there and gets its one decorator, and every module it compiles exists (a
rename breaks it here, not in a 10-minute benchmark run)."""

import ast
import os
import shutil

from kvroute.benchmarks import compiled_decision as probe
from kvroute.benchmarks.checkout import root


def test_the_probe_decorates_each_named_class_once_and_every_module_exists(tmp_path):
    for rel in probe.MODULES:
        assert os.path.isfile(os.path.join(root(), rel)), rel
    assert set(probe.CHANGES) <= set(probe.MODULES)
    for rel in probe.CHANGES:
        os.makedirs(tmp_path / os.path.dirname(rel), exist_ok=True)
        shutil.copy2(os.path.join(root(), rel), tmp_path / rel)
    probe.prepare(str(tmp_path))
    for rel, (open_classes, plain_classes) in probe.CHANGES.items():
        tree = ast.parse((tmp_path / rel).read_text())
        decorated = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                decorated[node.name] = [ast.unparse(d) for d in node.decorator_list if "mypyc_attr" in ast.unparse(d)]
        for name in open_classes:
            assert decorated[name] == ["mypyc_attr(allow_interpreted_subclasses=True)"], (rel, name)
        for name in plain_classes:
            assert decorated[name] == ["mypyc_attr(native_class=False)"], (rel, name)
        imports = [n for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "mypy_extensions"]
        assert len(imports) == 1, rel
