"""Pytest: collect the pack folder as a plain directory, not as a package.

The pack root has an ``__init__.py`` (ComfyUI imports it), so pytest would import it as a test
package named after the checkout folder, which fails for names that are not Python identifiers
(``ComfyUI-SageTriton``, ``wt-install``). Tests import the pack as ``sagetriton`` through
sagetriton_import.py instead.
"""
from pathlib import Path

import pytest

_ROOT = Path(__file__).resolve().parent


class _PackRootAsDirectory:
    # Registered globally: a conftest's own hooks only see paths below it, not its folder itself.
    @pytest.hookimpl(tryfirst=True)
    def pytest_collect_directory(self, path, parent):
        if Path(path).resolve() == _ROOT:
            return pytest.Dir.from_parent(parent, path=path)
        return None


def pytest_configure(config):
    config.pluginmanager.register(_PackRootAsDirectory(), "sagetriton-pack-root")
