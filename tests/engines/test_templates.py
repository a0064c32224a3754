"""Engine templates: rendering, built-ins, operator files and their errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.agent.engine_templates import (
    BUILTIN_TEMPLATES,
    EngineTemplate,
    TemplateError,
    load_templates,
    merged_templates,
    render,
)

VALUES = {
    "python": "/usr/bin/python3",
    "source": "/models/org/m v2",  # a space: must stay one argument
    "model": "org/m",
    "replica": "r1",
    "port": "8001",
    "host": "0.0.0.0",
    "gpus": "8",
    "gpu_uuids": "GPU-a,GPU-b",
    "total_gpus": "16",
    "nnodes": "2",
    "rank": "1",
    "leader_addr": "10.0.0.1",
    "rendezvous_port": "29500",
}


def test_render_substitutes_inside_words_and_never_splits_values() -> None:
    argv = render("serve {source} --port={port} --x '{model} here' {{lit}}", VALUES)
    assert argv == ["serve", "/models/org/m v2", "--port=8001", "--x", "org/m here", "{lit}"]


def test_render_rejects_unknown_variables_and_bad_quoting() -> None:
    with pytest.raises(TemplateError, match=r"unknown variable \{sauce\}"):
        render("serve {sauce}", VALUES)
    with pytest.raises(TemplateError, match="cannot split"):
        render("serve 'unterminated", VALUES)
    with pytest.raises(TemplateError, match="empty"):
        render("   ", VALUES)


def test_vllm_single_node() -> None:
    tpl = BUILTIN_TEMPLATES["vllm"]
    argv = render(tpl.command_for(rank=0, nnodes=1), VALUES)
    # --model, not the positional: the CPU build's api_server module takes only the option.
    assert argv[:4] == ["vllm", "serve", "--model", "/models/org/m v2"]
    assert argv[argv.index("--tensor-parallel-size") + 1] == "8"
    assert argv[argv.index("--served-model-name") + 1] == "org/m"
    assert argv[argv.index("--port") + 1] == "8001"
    assert "--nnodes" not in argv


def test_vllm_multi_node_leader_and_headless_worker() -> None:
    tpl = BUILTIN_TEMPLATES["vllm"]
    leader = render(tpl.command_for(rank=0, nnodes=2), {**VALUES, "rank": "0"})
    worker = render(tpl.command_for(rank=1, nnodes=2), VALUES)
    for argv, rank in ((leader, "0"), (worker, "1")):
        assert argv[argv.index("--nnodes") + 1] == "2"
        assert argv[argv.index("--node-rank") + 1] == rank
        assert argv[argv.index("--master-addr") + 1] == "10.0.0.1"
    assert "--headless" in worker and "--headless" not in leader
    assert tpl.serves_http(0) and not tpl.serves_http(1)


def test_sglang_multi_node_uses_total_gpus_and_dist_init_addr() -> None:
    argv = render(BUILTIN_TEMPLATES["sglang"].command_for(rank=1, nnodes=2), VALUES)
    assert argv[argv.index("--tp-size") + 1] == "16"
    assert argv[argv.index("--dist-init-addr") + 1] == "10.0.0.1:29500"
    single = render(BUILTIN_TEMPLATES["sglang"].command_for(rank=0, nnodes=1), VALUES)
    assert single[single.index("--tp-size") + 1] == "8"


def test_fake_template_uses_this_python() -> None:
    argv = render(BUILTIN_TEMPLATES["fake"].command, VALUES)
    assert argv[:3] == ["/usr/bin/python3", "-m", "llmgw.agent.fake_engine"]


def test_load_toml_tables_and_bare_strings(tmp_path: Path) -> None:
    f = tmp_path / "engines.toml"
    f.write_text(
        '[engines.vllm]\ncommand = "/opt/vllm/bin/vllm serve {source} --port {port}"\n'
        'health_path = "/ping"\n\n'
        '[engines]\ntiny = "tiny-engine --port {port} {source}"\n'
    )
    got = load_templates(f)
    assert got["vllm"].command.startswith("/opt/vllm/bin/vllm")
    assert got["vllm"].health_path == "/ping"
    assert got["tiny"] == EngineTemplate(command="tiny-engine --port {port} {source}")
    merged = merged_templates(got)
    assert merged["vllm"] == got["vllm"] and "sglang" in merged and "fake" in merged


def test_load_yaml_without_engines_key(tmp_path: Path) -> None:
    f = tmp_path / "engines.yaml"
    f.write_text("mine:\n  command: my-engine --port {port}\n  worker_serves_http: true\n")
    assert load_templates(f)["mine"].worker_serves_http is True


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        (
            "e.toml",
            '[engines.x]\ncommand = "run {nope}"\n',
            r"engine 'x': unknown variable \{nope\}",
        ),
        ("e.toml", '[engines.x]\ncmd = "run"\n', "engine 'x': .*cmd"),
        ("e.toml", "[engines.fake]\nstart_stall_s = -1\n", "engine 'fake': .*start_stall_s"),
        ("e.toml", "[engines\n", "not valid TOML"),
        ("e.yaml", "- a\n- b\n", "expected a table of engines"),
        ("e.yaml", "x: 3\n", "expected a command string or a table"),
        ("e.yaml", "'bad name!': run\n", "engine name"),
        ("e.json", "{}", r"must be a \.toml, \.yaml or \.yml"),
    ],
)
def test_load_errors_name_the_file_and_the_problem(
    tmp_path: Path, name: str, text: str, message: str
) -> None:
    f = tmp_path / name
    f.write_text(text)
    with pytest.raises(TemplateError, match=message) as info:
        load_templates(f)
    assert str(f) in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TemplateError, match="cannot read engine templates"):
        load_templates(tmp_path / "nope.toml")
