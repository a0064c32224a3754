"""Where a front end finds its controller: flags, then environment, then the
config file's current context, then the default (kubectl's order).

The file is `$XDG_CONFIG_HOME/llmgw/config.toml` (`~/.config/llmgw/config.toml`):

    current-context = "prod"

    [contexts.prod]
    controllers = ["https://ctl-a:7460", "https://ctl-b:7460"]  # or controller = "URL"
    token-file = "~/.config/llmgw/prod.token"
    ca-file = "/etc/llmgw/ca.pem"

    [contexts.demo]
    controller = "http://127.0.0.1:7460"

`ctl` and the console share `resolve()`, so they always agree on where they
point and `ctl config view` can say which source won for each setting.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from llmgw.common import DEFAULT_CONTROLLER, UsageError

CONTEXT_KEYS = ("controller", "controllers", "token-file", "ca-file")


def config_path(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    base = env.get("XDG_CONFIG_HOME") or str(Path(env.get("HOME", "~")).expanduser() / ".config")
    return Path(base) / "llmgw" / "config.toml"


class ConfigFile:
    # Plain classes here: a dataclass costs a one-shot its code generation.
    def __init__(
        self, path: Path, current: str | None, contexts: dict[str, dict[str, Any]]
    ) -> None:
        self.path = path
        self.current = current
        self.contexts = contexts

    @classmethod
    def load(cls, path: Path) -> ConfigFile:
        try:
            text = path.read_text()
        except FileNotFoundError:
            return cls(path, None, {})
        except OSError as exc:
            raise UsageError(f"cannot read {path}: {exc.strerror}") from exc
        import tomllib  # only when there is a file: a one-shot without one skips it

        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise UsageError(f"{path} is not valid TOML: {exc}") from exc
        contexts = data.get("contexts", {})
        if not isinstance(contexts, dict) or not all(
            isinstance(v, dict) for v in contexts.values()
        ):
            raise UsageError(f"{path}: `contexts` should be tables ([contexts.NAME])")
        for name, ctx in contexts.items():
            unknown = sorted(set(ctx) - set(CONTEXT_KEYS))
            if unknown:
                raise UsageError(
                    f"{path}: context {name} has unknown key(s) {', '.join(unknown)}; "
                    f"known: {', '.join(CONTEXT_KEYS)}"
                )
        current = data.get("current-context")
        if current is not None and not isinstance(current, str):
            raise UsageError(f"{path}: current-context should be a string")
        return cls(path, current, contexts)

    def set_current(self, name: str) -> None:
        """Write `current-context = NAME`, keeping the rest of the file as it is."""
        if name not in self.contexts:
            raise UsageError(self._unknown(name))
        line = f'current-context = "{name}"'
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            text = ""
        pattern = re.compile(r"^current-context\s*=.*$", re.MULTILINE)
        text = pattern.sub(line, text, count=1) if pattern.search(text) else f"{line}\n{text}"
        self.path.write_text(text)

    def _unknown(self, name: str) -> str:
        known = ", ".join(sorted(self.contexts)) or "none"
        return f"no context {name!r} in {self.path} (contexts: {known})"


class Setting:
    __slots__ = ("source", "value")

    def __init__(self, value: Any, source: str) -> None:
        self.value = value
        self.source = source  # "flag --controller", "env LLMGW_TOKEN", "context prod", "default"


class Resolved:
    """Where to connect, and where each part came from."""

    def __init__(
        self,
        controllers: list[str],
        token: str | None,
        ca_file: str | None,
        context: str | None,
        sources: dict[str, Setting],
    ) -> None:
        self.controllers = controllers
        self.token = token
        self.ca_file = ca_file
        self.context = context
        self.sources = sources

    @property
    def controller(self) -> str:
        return self.controllers[0]


def resolve(
    *,
    controller: str | None = None,
    token: str | None = None,
    token_file: str | None = None,
    ca_file: str | None = None,
    context: str | None = None,
    env: Mapping[str, str] | None = None,
    path: Path | None = None,
) -> Resolved:
    """Flags (the arguments) beat environment beats the config file's context."""
    env = os.environ if env is None else env
    file = ConfigFile.load(path or config_path(env))
    sources: dict[str, Setting] = {}

    if context:
        ctx_name: str | None = context
        sources["context"] = Setting(context, "flag --context")
    elif env.get("LLMGW_CONTEXT"):
        ctx_name = env["LLMGW_CONTEXT"]
        sources["context"] = Setting(ctx_name, "env LLMGW_CONTEXT")
    elif file.current:
        ctx_name = file.current
        sources["context"] = Setting(ctx_name, f"current-context in {file.path}")
    else:
        ctx_name = None
        sources["context"] = Setting(None, "none")
    if ctx_name is not None and ctx_name not in file.contexts:
        raise UsageError(file._unknown(ctx_name))
    ctx = file.contexts.get(ctx_name or "", {})
    from_ctx = f"context {ctx_name}"

    if controller:
        urls = [u for u in controller.split(",") if u.strip()]
        sources["controller"] = Setting(urls, "flag --controller")
    elif env.get("LLMGW_CONTROLLER"):
        urls = [u for u in env["LLMGW_CONTROLLER"].split(",") if u.strip()]
        sources["controller"] = Setting(urls, "env LLMGW_CONTROLLER")
    elif "controllers" in ctx or "controller" in ctx:
        raw = ctx.get("controllers", ctx.get("controller"))
        urls = [raw] if isinstance(raw, str) else list(raw or [])
        if not urls or not all(isinstance(u, str) and u for u in urls):
            raise UsageError(f"{file.path}: context {ctx_name}: controller(s) should be URLs")
        sources["controller"] = Setting(urls, from_ctx)
    else:
        urls = [DEFAULT_CONTROLLER]
        sources["controller"] = Setting(urls, "default")
    from llmgw.api import normalize_url
    from llmgw.leader import url_problem

    for url in urls:
        if (problem := url_problem(url)) is not None:
            where = sources["controller"].source.removeprefix("flag ").removeprefix("env ")
            raise UsageError(f"{where} {url.strip()}: {problem} (e.g. http://HOST:7460)")
    urls = [normalize_url(u) for u in urls]
    sources["controller"] = Setting(urls, sources["controller"].source)

    resolved_token: str | None
    if token:
        resolved_token = token
        sources["token"] = Setting("(hidden)", "flag --token")
    elif token_file:
        resolved_token = read_token_file(token_file, "--token-file")
        sources["token"] = Setting(token_file, "flag --token-file")
    elif env.get("LLMGW_TOKEN"):
        resolved_token = env["LLMGW_TOKEN"]
        sources["token"] = Setting("(hidden)", "env LLMGW_TOKEN")
    elif env.get("LLMGW_TOKEN_FILE"):
        resolved_token = read_token_file(env["LLMGW_TOKEN_FILE"], "LLMGW_TOKEN_FILE")
        sources["token"] = Setting(env["LLMGW_TOKEN_FILE"], "env LLMGW_TOKEN_FILE")
    elif ctx.get("token-file"):
        where = f"{from_ctx}'s token-file"
        resolved_token = read_token_file(str(ctx["token-file"]), where)
        sources["token"] = Setting(str(ctx["token-file"]), from_ctx)
    else:
        resolved_token = None
        sources["token"] = Setting(None, "none")

    if ca_file:
        ca: str | None = ca_file
        sources["ca-file"] = Setting(ca, "flag --ca-file")
    elif env.get("LLMGW_CA_FILE"):
        ca = env["LLMGW_CA_FILE"]
        sources["ca-file"] = Setting(ca, "env LLMGW_CA_FILE")
    elif ctx.get("ca-file"):
        ca = str(Path(str(ctx["ca-file"])).expanduser())
        sources["ca-file"] = Setting(ca, from_ctx)
    else:
        ca = None
        sources["ca-file"] = Setting(None, "none (system trust store)")
    return Resolved(urls, resolved_token, ca, ctx_name, sources)


def read_token_file(path: str, what: str) -> str:
    p = Path(path).expanduser()
    try:
        token = p.read_text().strip()
    except OSError as exc:
        raise UsageError(f"cannot read the token file {p} ({what}): {exc.strerror}") from exc
    if not token:
        raise UsageError(f"the token file {p} ({what}) is empty")
    return token
