"""Every course_lib module imports without side effects, and its docstring examples hold."""

import doctest
import importlib
import pkgutil

import pytest

import course_lib

MODULES = sorted(m.name for m in pkgutil.walk_packages(course_lib.__path__, "course_lib.")
                 if not m.name.endswith("__main__"))


@pytest.mark.parametrize("name", MODULES)
def test_module_imports_and_its_doctests_pass(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0
