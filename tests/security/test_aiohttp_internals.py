"""The aiohttp internals llmgw/controller/http/serve.py relies on still exist as it uses
them: the connection handler's class is swapped for one with a JSON `handle_error`
(the behaviour itself is tested against a real controller in test_bodies_e2e.py)."""

from __future__ import annotations

import inspect

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from llmgw.controller.http.serve import _JsonParseErrors


def test_handle_error_takes_what_the_override_takes() -> None:
    ours = list(inspect.signature(_JsonParseErrors.handle_error).parameters)
    assert list(inspect.signature(RequestHandler.handle_error).parameters) == ours


def test_the_handler_class_can_be_swapped_on_a_live_object() -> None:
    # A class assignment needs the same slots layout: the subclass adds none.
    assert "__slots__" in RequestHandler.__dict__ and _JsonParseErrors.__slots__ == ()
    assert "__dict__" not in _JsonParseErrors.__dict__


def test_the_server_tells_connection_made_with_its_handler() -> None:
    assert list(inspect.signature(web.Server.connection_made).parameters) == [
        "self",
        "handler",
        "transport",
    ]
