"""Server phases in-process: 503 while loading and draining, OpenAI error shapes, fault routes gated."""

from __future__ import annotations

from starlette.testclient import TestClient

from stagewise.server.app import guarded_app
from stagewise.server.serve_settings import ServeSettings
from stagewise.server.server_state import ServerState

CHAT = {"messages": [{"role": "user", "content": "hi"}]}


def test_loading_then_draining_is_503() -> None:
    state = ServerState(ServeSettings())
    with TestClient(guarded_app(state)) as http:
        health = http.get("/health")
        assert health.status_code == 503 and health.json() == {"status": "loading"}
        for response in (http.post("/v1/chat/completions", json=CHAT), http.get("/v1/models")):
            assert response.status_code == 503
            assert response.json()["error"]["type"] == "service_unavailable"
        assert http.get("/metrics").status_code == 200
        assert state.begin_draining()
        assert not state.begin_draining()  # a second signal
        assert http.get("/health").json() == {"status": "draining"}


def test_warming_up_is_503_until_ready() -> None:
    state = ServerState(ServeSettings())
    with TestClient(guarded_app(state)) as http:
        assert state.set_warming_up()
        assert not state.set_warming_up()  # only from loading
        health = http.get("/health")
        assert health.status_code == 503 and health.json() == {"status": "warming_up"}
        response = http.post("/v1/chat/completions", json=CHAT)
        assert response.status_code == 503 and "warming_up; retry later" in response.json()["error"]["message"]
        assert state.begin_draining()
        assert not state.set_warming_up()


def test_no_warmup_flag() -> None:
    from stagewise.cli.cmd_serve import settings_from_args
    from stagewise.cli.main import build_parser

    assert settings_from_args(build_parser().parse_args(["serve"])).warm_up
    assert not settings_from_args(build_parser().parse_args(["serve", "--no-warmup"])).warm_up


def test_unknown_route_and_fault_routes_off() -> None:
    state = ServerState(ServeSettings(fault_injection=False))
    with TestClient(guarded_app(state)) as http:
        missing = http.get("/v1/nothing")
        assert missing.status_code == 404 and set(missing.json()["error"]) == {"message", "type", "param", "code"}
        assert http.post("/debug/fail-next-step", json={"stage": 0}).status_code == 404


def test_api_key_checked_before_anything_else() -> None:
    state = ServerState(ServeSettings(api_key="k"))
    with TestClient(guarded_app(state)) as http:
        assert http.post("/v1/chat/completions", json=CHAT).status_code == 401
        assert http.post("/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer k"}).status_code == 503
        assert http.get("/health").status_code == 503  # open, but still loading


def test_deeply_nested_json_is_400() -> None:
    state = ServerState(ServeSettings())
    with TestClient(guarded_app(state)) as http:
        response = http.post("/v1/chat/completions", content=b"[" * 100000 + b"]" * 100000)
        assert response.status_code == 400
