"""Read deploy/systemd's units as systemd would run them: a unit plus its drop-ins, the
files docs/deployment.md tells the operator to create, and ExecStart expanded into an argv.

What systemd does that matters here (systemd.exec(5), systemd.service(5)):
Environment= and EnvironmentFile= set variables, a later assignment wins; `%d` is the
credentials directory, where each LoadCredential=ID:PATH is copied as ID; in ExecStart
`${VAR}` is one word and a bare `$VAR` word splits on whitespace (and vanishes when
unset or empty).
"""

from __future__ import annotations

import re
import secrets
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

UNITS = Path(__file__).resolve().parents[2] / "deploy" / "systemd"
INSTALL_DOC = Path(__file__).resolve().parents[2] / "docs" / "deployment.md"  # the install steps
NAMES = ["llmgw-agent.service", "llmgw-controller.service", "llmgw-gateway.service"]

# The drop-ins an operator may install with each unit: one set per way to run it.
VARIANTS: dict[str, list[tuple[str, ...]]] = {
    "llmgw-agent.service": [("enroll.conf",), ("token.conf",)],
    "llmgw-controller.service": [
        ("enroll.conf",),
        ("agent-tokens.conf",),
        ("enroll.conf", "tls.conf"),
        ("agent-tokens.conf", "enroll.conf", "tls.conf"),
    ],
    "llmgw-gateway.service": [()],
}


def directives(path: Path) -> list[tuple[str, str]]:
    out = []
    for line in path.read_text().splitlines():
        if line and not line.startswith(("#", "[")) and "=" in line:
            key, _, value = line.partition("=")
            out.append((key, value))
    return out


def dropin(unit: str, name: str) -> Path:
    return UNITS / f"{unit}.d" / name


def env_file_values(text: str) -> dict[str, str]:
    """An EnvironmentFile: KEY=VALUE lines, the value optionally quoted."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key] = " ".join(shlex.split(value))
    return out


@dataclass
class Service:
    """One unit with its drop-ins, on a host whose /etc/llmgw is `etc`."""

    unit: str
    dropins: Sequence[str] = ()
    lines: list[tuple[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.lines = directives(UNITS / self.unit)
        for name in self.dropins:
            self.lines += directives(dropin(self.unit, name))

    def values(self, key: str) -> list[str]:
        return [v for k, v in self.lines if k == key]

    def credentials(self) -> dict[str, str]:
        """LoadCredential= ID -> the source path the operator creates."""
        return dict(v.split(":", 1) for v in self.values("LoadCredential"))

    def environment(self, creds: Path, env_files: Mapping[str, str]) -> dict[str, str]:
        """Environment= and EnvironmentFile= in order; `env_files` maps a path to its text."""
        env: dict[str, str] = {}
        for k, v in self.lines:
            if k == "Environment":
                for item in shlex.split(v.replace("%d", str(creds))):
                    name, _, value = item.partition("=")
                    env[name] = value
            elif k == "EnvironmentFile":
                path = v.removeprefix("-")
                if path in env_files:
                    env.update(env_file_values(env_files[path]))
                elif not v.startswith("-"):
                    raise AssertionError(f"{self.unit}: EnvironmentFile {path} is not optional")
        return env

    def argv(self, creds: Path, env: Mapping[str, str]) -> list[str]:
        (cmd,) = self.values("ExecStart")
        cmd = cmd.replace("%d", str(creds))
        words = []
        for word in shlex.split(cmd):
            bare = re.fullmatch(r"\$(\w+)", word)
            if bare:
                words += env.get(bare.group(1), "").split()
            else:
                words.append(re.sub(r"\$\{(\w+)\}", lambda m: env.get(m.group(1), ""), word))
        return words


def token() -> str:
    return secrets.token_hex(32)


@dataclass
class Tls:
    """A private CA and the controller's certificate, as an operator would have them."""

    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes


def make_tls() -> Tls:
    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("localhost", "127.0.0.1")
    return Tls(
        ca.cert_pem.bytes(),
        b"".join(b.bytes() for b in cert.cert_chain_pems),
        cert.private_key_pem.bytes(),
    )


def operator_files(etc: Path, controller_url: str, tls: Tls | None = None) -> dict[str, str]:
    """Write what docs/deployment.md's "Install on a real fleet" has the operator create in /etc/llmgw
    on the controller host, a GPU node and a gateway host (one directory here: no name
    is on two hosts with different contents). Returns the env files' texts by the path
    the units name."""
    etc.mkdir(parents=True, exist_ok=True)
    gateway_line = f"gw1 {token()}"
    enroll = token()
    files = {
        # controller host
        "admin.tokens": f"alice {token()}\n",
        "read.tokens": f"grafana {token()}\n",
        "gateway.tokens": gateway_line + "\n",
        "enroll.token": enroll + "\n",
        "agent.tokens": f"gpu-a01 {(agent := token())}\n",
        # GPU node (enroll.token as above, or its own line of agent.tokens)
        "agent.token": f"gpu-a01 {agent}\n",
        # gateway host
        "gateway.token": gateway_line + "\n",
        "client-keys": f"team-a {token()}\n",
    }
    for name, text in files.items():
        (etc / name).write_text(text)
        (etc / name).chmod(0o600)
    env_files = {
        "/etc/llmgw/agent.env": f"LLMGW_CONTROLLER_URL={controller_url}\n"
        'LLMGW_AGENT_ARGS="--fabric ib-a --fake-gpus 2xH100-80GB"\n',
        "/etc/llmgw/gateway.env": f"LLMGW_CONTROLLER_URL={controller_url}\n",
    }
    if tls is not None:
        (etc / "tls.crt").write_bytes(tls.cert_pem)
        (etc / "tls.key").write_bytes(tls.key_pem)
        (etc / "tls.key").chmod(0o600)
        (etc / "ca.pem").write_bytes(tls.ca_pem)
        env_files["/etc/llmgw/agent.env"] += f"LLMGW_CA_FILE={etc / 'ca.pem'}\n"
        env_files["/etc/llmgw/gateway.env"] += f"SSL_CERT_FILE={etc / 'ca.pem'}\n"
    return env_files


def load_credentials(service: Service, etc: Path, creds: Path) -> None:
    """What LoadCredential= does: copy each source into the credentials directory."""
    creds.mkdir(parents=True, exist_ok=True)
    for ident, source in service.credentials().items():
        assert source.startswith("/etc/llmgw/"), f"{service.unit}: {source} outside /etc/llmgw"
        local = etc / source.removeprefix("/etc/llmgw/")
        assert local.exists(), (
            f"{service.unit} {service.dropins}: LoadCredential={ident}:{source}, "
            "which the install steps (docs/deployment.md) do not create"
        )
        (creds / ident).write_bytes(local.read_bytes())
