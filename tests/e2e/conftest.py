"""A module's shared server. A test module that defines `start_server(tmpdir)` (returns a
started `ServerProcess`) gets the fixtures `server`, for tests that leave the server whole,
and `taken_server`, for a test that ends it: a test after that one gets a new server. The
server starts when a test first asks for it and stops with the module."""

from __future__ import annotations

import pytest

from tests.e2e.server import ServerProcess


@pytest.fixture(scope="module")
def _module_servers():
    """[the module's live server] once started, [] before and once taken."""
    held: list[ServerProcess] = []
    yield held
    for srv in held:
        srv.stop()


@pytest.fixture
def server(request, _module_servers, tmp_path_factory) -> ServerProcess:
    if not _module_servers:
        tmpdir = str(tmp_path_factory.mktemp("server"))
        _module_servers.append(request.module.start_server(tmpdir))
    return _module_servers[0]


@pytest.fixture
def taken_server(_module_servers, server):
    _module_servers.clear()
    yield server
    server.stop()
