"""Fixtures every test area shares.

``cni_bin``: the CNI_PATH the tests exec Ferry from: ``$FERRY_CNI_BIN`` when it holds ``ferry``
(``make bin`` writes build/cni-bin and .ci/test.sh points there), else launchers written from this
tree into a fresh directory, once per run. Debian's reference plugins are found beside them
(the launcher links them)."""

from __future__ import annotations

import os

import pytest

from lab.api import ensure_cni_bin


@pytest.fixture(scope="session")
def cni_bin(tmp_path_factory: pytest.TempPathFactory) -> str:
    env = os.environ.get("FERRY_CNI_BIN")
    if env and os.access(os.path.join(env, "ferry"), os.X_OK):
        return env
    return ensure_cni_bin(str(tmp_path_factory.mktemp("cni-bin")))
