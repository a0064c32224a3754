"""Wire types: everything that crosses a process boundary.

Inbound models (what an agent or an operator sends) forbid unknown fields and
bound every list and string, so one malformed or hostile body cannot grow the
controller's memory. Outbound views are plain models with the same habits.

Agents send durations, never wall-clock timestamps: node clocks skew. The
controller stamps the time it received a report.
"""

from __future__ import annotations

import ipaddress
import re
from collections import Counter
from enum import StrEnum
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    StringConstraints,
    field_validator,
    model_validator,
)
from pydantic_core import CoreConfig, SchemaValidator

from llmgw.common import printable as printable  # (re-exported: the agent's import)

# -- text rules ------------------------------------------------------------------

# C0 controls, DEL and C1 controls: what moves a terminal's cursor or starts an
# escape sequence. Names and short fields may hold none of them; agent free
# text (engine errors, log tails) may hold tab and newline only. Checked as
# string patterns, which pydantic runs in Rust: a Python validator per string
# made a report's validation 1.7 x slower (bench/bench_hardening.py).
NO_CONTROL_PATTERN = r"^[^\x00-\x1f\x7f-\x9f]*$"
LINES_ONLY_PATTERN = r"^[^\x00-\x08\x0b-\x1f\x7f-\x9f]*$"
# A node name is a host name (RFC 1123): dot-separated labels of letters, digits and
# inner hyphens, 1-63 characters each, no empty label (`a..b`) and no trailing dot
# (`n1.`). It is normalised to lower case, as DNS compares names, so `GPU-A01` and
# `gpu-a01` are one node. Checked as a pattern (in Rust, once per report) and then
# lowered; a name of digits and dots only must be an IPv4 address (`0` would read as
# 0.0.0.0), checked after.
NODE_NAME_PATTERN = r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
NODE_NAME_RULE = (
    "a node name is a host name: dot-separated labels of letters, digits and inner "
    "hyphens, 1 to 63 characters each, no empty label and no trailing dot "
    "(gpu-a01, gpu-a01.example.com)"
)


# Inbound JSON bodies are validated by `validate_json`: a body that cannot hold a
# control character skips the two patterns above (see there).
# What a 400 says instead of quoting the pattern.
PATTERN_MESSAGES = {
    NO_CONTROL_PATTERN: "control characters (newline, escape, ...) are not allowed here",
    LINES_ONLY_PATTERN: "control characters other than tab and newline are not allowed here",
    NODE_NAME_PATTERN: NODE_NAME_RULE,
}


def _text(min_length: int | None = None, max_length: int = 256, **kw: Any) -> Any:
    """A bounded string free of control characters."""
    return StringConstraints(
        min_length=min_length, max_length=max_length, pattern=NO_CONTROL_PATTERN, **kw
    )


E = TypeVar("E", bound=StrEnum)
Body = TypeVar("Body", bound=BaseModel)
# An enum field takes its value's string from Python callers too (YAML, tests);
# only exact values match, so nothing is coerced.
ByValue = Annotated[E, Strict(False)]

# -- bounded scalar types -----------------------------------------------------


def _not_a_number(value: str) -> str:
    if _DOTTED_NUMBERS.fullmatch(value):
        try:
            ipaddress.IPv4Address(value)
        except ValueError:
            raise ValueError(
                f"{NODE_NAME_RULE}; {value!r} is all digits, which reads as an IP address"
            ) from None
    elif _reads_as_ipv4(value):
        raise ValueError(f"{NODE_NAME_RULE}; {value!r} reads as an IPv4 address in hex")
    return value


NodeName = Annotated[
    str,
    StringConstraints(min_length=1, max_length=253, pattern=NODE_NAME_PATTERN, to_lower=True),
    AfterValidator(_not_a_number),
]


def node_name(value: str) -> str:
    """The node `value` names (lower case), by NodeName's rule; ValueError saying the
    rule when it names none. For names outside a body: a URL's path, a command line."""
    if not 0 < len(value) <= 253 or not re.fullmatch(NODE_NAME_PATTERN, value):
        raise ValueError(f"{value[:80]!r}: {NODE_NAME_RULE}")
    return _not_a_number(value.lower())


ModelName = Annotated[
    str,
    StringConstraints(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/@:+-]*$"),
]
ShortText = Annotated[str, _text(max_length=256)]
# Agent free text (errors, log tails): lines allowed, other controls refused.
Text = Annotated[str, StringConstraints(max_length=4096, pattern=LINES_ONLY_PATTERN)]
PathText = Annotated[str, _text(1, 4096)]
Uuid = Annotated[str, _text(1, 128)]
GpuClass = Annotated[str, _text(1, 64)]
EngineName = Annotated[str, _text(1, 64)]
ReplicaId = Annotated[str, _text(1, 64)]
FabricName = Annotated[
    str, StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$")
]
Reason = Annotated[str, _text(1, 1024, strip_whitespace=True)]
# Bounded to what they mean: a process exit status is a 32-bit signed integer;
# durations are at most a year, sizes at most an exabyte.
ExitCode = Annotated[int, Field(ge=-(2**31), le=2**31 - 1)]
MAX_DURATION_S = 366 * 86_400.0
Seconds = Annotated[float, Field(ge=0, le=MAX_DURATION_S)]
Bytes = Annotated[int, Field(ge=0, le=2**60)]
MiB = Annotated[int, Field(ge=0, le=2**40)]


_HOST_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
_DOTTED_NUMBERS = re.compile(r"[0-9.]+")
# What a resolver's inet_aton reads as an IPv4 address although it has letters: one to
# four numbers, decimal or hex (0x7f.0.0.1 and 0x7f000001 are both 127.0.0.1).
_HEX_IPV4 = re.compile(r"(?:0[xX][0-9A-Fa-f]+|[0-9]+)(?:\.(?:0[xX][0-9A-Fa-f]+|[0-9]+)){0,3}")


def _reads_as_ipv4(value: str) -> bool:
    """A name with hex numbers that a resolver would take for an IPv4 address."""
    return ("x" in value or "X" in value) and _HEX_IPV4.fullmatch(value) is not None


# An IPv4 dotted quad as ipaddress takes it (no leading zeros), or a host name
# whose labels `_HOST_LABEL` takes and which is not all digits and dots.
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_PLAIN_ADDRESS = re.compile(
    rf"{_OCTET}(?:\.{_OCTET}){{3}}"
    r"|(?=[0-9.]*[A-Za-z-])(?=.{1,253}\Z)"
    r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*"
)
ADDRESS_RULE = "a host name or an IP literal (gpu-a01.example.com, 10.0.0.7, fd00::7)"


def host_problem(value: str) -> str | None:
    """Why `value` is not a host name or an IP literal, or None when it is one.

    A host name is dot-separated labels of letters, digits and inner hyphens
    (1-63 characters each, 253 in all, no empty label, no trailing dot); an IP
    literal is IPv4 dotted-quad or IPv6 without brackets or zone. Anything else
    (a space, a slash, a percent sign, a port) would make an engine URL that no
    gateway can use; a name of hex numbers (0x7f.0.0.1) is an IPv4 address in
    disguise to a resolver, not a host name."""
    if _PLAIN_ADDRESS.fullmatch(value):  # what nearly every report carries: one regex
        if _reads_as_ipv4(value):
            return (
                f"must be {ADDRESS_RULE}: {value!r} reads as an IPv4 address in hex; "
                "write the address as a dotted quad"
            )
        return None
    if not value or len(value) > 253:
        return f"must be {ADDRESS_RULE}: 1 to 253 characters"
    if "%" in value and ":" in value:
        return (
            f"must be {ADDRESS_RULE}: {value!r} has an IPv6 zone id (%...), which an engine"
            " URL cannot carry and other hosts cannot route; give an address that is not"
            " link-local"
        )
    if ":" in value:
        try:
            ipaddress.IPv6Address(value)
        except ValueError:
            return f"must be {ADDRESS_RULE}: {value!r} is not an IPv6 address"
        return None
    if _DOTTED_NUMBERS.fullmatch(value):
        try:
            ipaddress.IPv4Address(value)
        except ValueError:
            return f"must be {ADDRESS_RULE}: {value!r} is not an IPv4 address"
        return None
    if not all(_HOST_LABEL.fullmatch(label) for label in value.split(".")):
        return f"must be {ADDRESS_RULE}"
    return None


def _host(value: str) -> str:
    problem = host_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


# Where engines on a node are reached: it becomes the host of every engine URL.
HostAddress = Annotated[str, StringConstraints(max_length=253), AfterValidator(_host)]


class Inbound(BaseModel):
    """Base for bodies we receive: unknown fields are an error, not ignored.

    Strict: nothing is coerced ("5" is not 5, true is not 1, "true" is not
    true) and floats must be finite (Infinity, NaN and 1e400 are refused).
    """

    model_config = ConfigDict(
        extra="forbid", frozen=True, strict=True, allow_inf_nan=False, defer_build=True
    )


# -- validating a JSON body -------------------------------------------------------

# How a control character can get into a string of a JSON text: as an escape
# (`\n`, `\u001b`, `\u0085`, `\u007f`), or as a raw DEL or C1 character (raw C0
# characters are invalid JSON: the parser refuses them in a string). The escape
# scan is run only when the body holds a backslash at all.
_CONTROL_ESCAPE = re.compile(rb"\\(?:[bfnrt]|u00[0-1]|u00[89]|u007[fF])")
_TEXT_PATTERNS = frozenset({NO_CONTROL_PATTERN, LINES_ONLY_PATTERN})


def may_hold_control(raw: bytes) -> bool:
    """Whether some string of the JSON text `raw` may hold a control character
    (C0, DEL or C1). False is certain; True may be a false alarm (`\\\\n`)."""
    return (
        b"\x7f" in raw
        or b"\xc2" in raw  # U+0080-U+00BF, the C1 controls among them
        or (b"\\" in raw and _CONTROL_ESCAPE.search(raw) is not None)
    )


def _without(schema: Any, patterns: frozenset[str]) -> Any:
    """A copy of a core schema without the string patterns named."""
    if isinstance(schema, dict):
        return {
            k: _without(v, patterns)
            for k, v in schema.items()
            if not (k == "pattern" and v in patterns)
        }
    if isinstance(schema, list):
        return [_without(v, patterns) for v in schema]
    return schema


_LEAN: dict[type[BaseModel], SchemaValidator] = {}


def _lean(model: type[BaseModel]) -> SchemaValidator:
    """`model`'s validator without the control-character patterns: the same
    schema (strictness, bounds, the other patterns, the model validators), the
    same classes built, the same errors for everything but those patterns."""
    lean = _LEAN.get(model)
    if lean is None:
        model.model_rebuild()  # (defer_build: the schema is built on first use)
        config = CoreConfig(title=model.__name__)  # as the model's own errors are titled
        lean = _LEAN[model] = SchemaValidator(
            _without(model.__pydantic_core_schema__, _TEXT_PATTERNS), config
        )
    return lean


def validate_json(model: type[Body], raw: bytes) -> Body:
    """`model.model_validate_json(raw)`, for the bodies the controller receives.

    The text patterns are the costliest part of validating a report: a regex
    call per string, some sixty strings (bench/bench_hardening.py). A body that
    cannot hold a control character cannot fail them, so it is validated
    without them (one scan of the bytes instead); any other body by the model's
    full schema, which says which field holds what."""
    if may_hold_control(raw):
        return model.model_validate_json(raw)
    return _lean(model).validate_json(raw)


class Outbound(BaseModel):
    model_config = ConfigDict(frozen=True, populate_by_name=True, defer_build=True)


# -- enums ---------------------------------------------------------------------


class NodeState(StrEnum):
    READY = "ready"
    CORDONED = "cordoned"
    DRAINING = "draining"
    UNREACHABLE = "unreachable"


class AdminFlag(StrEnum):
    """What an operator set on a node. Liveness is derived, never stored."""

    NONE = "none"
    CORDONED = "cordoned"
    DRAINING = "draining"


class GpuHealth(StrEnum):
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"
    UNKNOWN = "unknown"


class StorageScope(StrEnum):
    LOCAL = "local"
    SHARED = "shared"


class ReplicaState(StrEnum):
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    FAILED = "failed"
    SLEEPING = "sleeping"  # its process keeps its cards, serves nothing (issue 32)
    WAKING = "waking"  # a sleeping replica on its way back to ready


class ShardState(StrEnum):
    """What an agent says about one engine process it runs."""

    STARTING = "starting"
    READY = "ready"
    STOPPING = "stopping"
    FAILED = "failed"
    SLEEPING = "sleeping"  # its engine answered the sleep: it serves nothing
    WAKING = "waking"  # asked to wake, not answered yet


class SleepFailure(StrEnum):
    """Why an engine asked to sleep is awake instead (beside `sleep_error`'s words)."""

    NO_SLEEP_MODE = "no_sleep_mode"  # its template has none, or it started without it
    NO_ENDPOINTS = "no_endpoints"  # /sleep answered 404: an old version, no dev mode
    REFUSED = "refused"  # /sleep answered an error, or nothing
    # /sleep answered 200 but its processes still held the memory on a card (vLLM
    # #47654): woken again, so that nothing is placed on a card it still fills
    MEMORY_KEPT = "memory_kept"


# -- the agent's report ---------------------------------------------------------


class GpuReport(Inbound):
    uuid: Uuid
    index: int = Field(ge=0, le=4096)
    name: ShortText = ""  # raw product name as NVML gives it
    gpu_class: GpuClass  # normalised name + memory in GiB, e.g. H100-SXM-80GB
    memory_total_mib: MiB
    memory_used_mib: MiB | None = None
    utilization_pct: int | None = Field(default=None, ge=0, le=100)
    in_use: bool = False  # compute processes present on the card
    health: ByValue[GpuHealth] = GpuHealth.UNKNOWN
    health_reason: Text | None = None
    mig_parent_uuid: Uuid | None = None  # set when this device is a MIG slice


class ModelFound(Inbound):
    name: ModelName  # relative path (org/name) or HF cache repo id
    path: PathText
    format: Annotated[str, _text(max_length=32)] = "safetensors"
    size_bytes: Bytes
    files: int = Field(default=0, ge=0, le=10_000_000)


class AdapterFound(Inbound):
    """A complete LoRA adapter directory: adapter_config.json naming a LoRA, and its
    weight file whole."""

    name: ModelName
    path: PathText
    rank: int = Field(ge=1, le=65_536)
    base: ShortText | None = None  # base_model_name_or_path, as the adapter says
    size_bytes: Bytes = 0


class ModelIncomplete(Inbound):
    """A directory that looks like a model but is not usable, and why."""

    name: ShortText
    path: PathText
    reason: Text


class StorageLocation(Inbound):
    path: PathText
    fs_type: ShortText = ""
    scope: ByValue[StorageScope] = StorageScope.LOCAL
    scope_overridden: bool = False
    mount_source: Text = ""  # e.g. filer1:/export/models
    mount_point: PathText | None = None
    error: Text | None = None  # e.g. the directory does not exist
    models: list[ModelFound] = Field(default_factory=list, max_length=4096)
    incomplete: list[ModelIncomplete] = Field(default_factory=list, max_length=4096)
    adapters: list[AdapterFound] = Field(default_factory=list, max_length=4096)


class EngineTraffic(Inbound):
    """What an engine served over the agent's last window of scrapes (agent/traffic.py)."""

    requests_per_s: float = Field(ge=0, le=10_000_000)
    in_flight: int = Field(ge=0, le=10_000_000)  # running and queued
    p50_latency_s: Seconds | None = None  # None: no request finished in the window
    # Which histogram p50_latency_s is read from: "ttft" (time to first token, fine
    # buckets) or "e2e" (end to end; vLLM's buckets start at 0.3 s). None: an older agent (e2e).
    p50_metric: Literal["ttft", "e2e"] | None = None
    # The median lies in the first bucket: p50_latency_s is that bucket's bound, not a value.
    p50_upper_bound: bool = False
    prefix_hit_rate: float | None = Field(default=None, ge=0, le=1)  # None: no prompt seen


class AdapterFailure(Inbound):
    """A load the engine refused: its HTTP status (None: no answer) and its words."""

    name: ModelName
    status: int | None = Field(default=None, ge=100, le=599)
    message: Text


class ReplicaReport(Inbound):
    """One engine (one shard of a replica) that the agent runs."""

    id: ReplicaId
    model: ModelName
    rank: int = Field(default=0, ge=0, le=1024)
    state: ByValue[ShardState]
    gpus: list[Uuid] = Field(default_factory=list, max_length=256)
    port: int | None = Field(default=None, ge=1, le=65535)
    idle_seconds: Seconds | None = None  # None: not known yet
    exit_code: ExitCode | None = None
    error: Text | None = None
    traffic: EngineTraffic | None = None  # rank 0 of a ready engine, once scraped twice
    # Asked to sleep, it did not: why (no sleep mode, the engine refused). Said in
    # every report from then on; the agent never tries that engine again.
    sleep_error: Text | None = None
    # LoRA adapters the engine holds now (rank 0), and the loads it refused (kept
    # while the assignment still asks for them).
    adapters: list[ModelName] = Field(default_factory=list, max_length=4096)
    adapter_failures: list[AdapterFailure] = Field(default_factory=list, max_length=4096)
    sleep_failure: ByValue[SleepFailure] | None = None  # its kind (None: an older agent)


class NodeReport(Inbound):
    node: NodeName
    agent_version: ShortText
    boot_id: ShortText
    interval_s: float = Field(gt=0, le=3600)
    uptime_s: Seconds | None = None  # agent uptime, a duration
    address: HostAddress | None = None  # where engines on this node can be reached
    gpus: list[GpuReport] = Field(default_factory=list, max_length=256)
    gpu_error: Text | None = None  # why there are no GPUs (no NVML, driver error)
    fabrics: list[FabricName] = Field(default_factory=list, max_length=16)
    storage_configured: bool = False
    storage: list[StorageLocation] = Field(default_factory=list, max_length=64)
    replicas: list[ReplicaReport] = Field(default_factory=list, max_length=256)
    # Engine templates this agent can run (built-in and --engine-templates);
    # None: not said (an older agent). Lets `ctl apply` warn about an engine
    # no node has before its replicas fail.
    engines: list[EngineName] | None = Field(default=None, max_length=64)

    @model_validator(mode="after")
    def _gpus_unique(self) -> NodeReport:
        """One card, one entry: a repeated UUID or index would let one card be placed twice."""
        gpus, n = self.gpus, len(self.gpus)
        if n < 2 or (len({g.uuid for g in gpus}) == n and len({g.index for g in gpus}) == n):
            return self  # (sets: what every report pays; the names of repeats only on a refusal)
        for what, values in (
            ("uuid", [g.uuid for g in self.gpus]),
            ("index", [g.index for g in self.gpus]),
        ):
            dupes = sorted(str(v) for v, n in Counter(values).items() if n > 1)
            if dupes:
                raise ValueError(f"GPU {what} repeated: {', '.join(dupes[:5])}")
        return self


class ShardAssignment(Outbound):
    """One engine the controller wants a node to run."""

    replica_id: str
    model: str
    source: str
    engine: str
    engine_args: list[str] = Field(default_factory=list)
    gpus: list[str]  # UUIDs of the cards to use
    rank: int = 0
    nnodes: int = 1
    leader_node: str | None = None
    leader_address: str | None = None
    port: int | None = None  # rendezvous port for multi-node engines
    sleep_mode: bool = False  # start the engine able to sleep (its spec asks for sleep)
    sleep_level: int | None = None  # asleep at this level (1, 2); None: awake
    # LoRA adapters the engine should hold: name -> source (found in the agent's storage)
    adapters: dict[str, str] = Field(default_factory=dict)
    # The spec says `auto`: the agent picks the level from its host memory and the
    # weights (agent.sleep_level); `sleep_level` is then 2, what an older agent uses.
    sleep_auto: bool = False

    def awake(self) -> ShardAssignment:
        """The same engine, awake: what decides whether a changed assignment restarts it."""
        if self.sleep_level is None and not self.sleep_auto:
            return self
        return self.model_copy(update={"sleep_level": None, "sleep_auto": False})

    def started_as(self) -> ShardAssignment:
        """What restarts the engine when it changes: neither its sleep nor its adapters."""
        if self.sleep_level is None and not self.sleep_auto and not self.adapters:
            return self
        return self.model_copy(update={"sleep_level": None, "sleep_auto": False, "adapters": {}})


class ReportReply(Outbound):
    node: str
    admin_flag: AdminFlag
    state: NodeState
    assignments: list[ShardAssignment] = Field(default_factory=list)


# -- admin requests --------------------------------------------------------------


class ReasonRequest(Inbound):
    reason: Reason


class EnrollRequest(Inbound):
    """`POST /v1/agent/enroll` with the enrollment token: a node asks for its credential."""

    node: NodeName


class EnrollReply(Outbound):
    node: str
    credential: str  # shown once; the controller keeps only its hash
    # The node gets no replicas until an admin approves it (--enroll-approval).
    awaiting_approval: bool = False


class CredentialView(Outbound):
    node: str
    source: str  # "enrolled" (revocable with ctl) | "file" (--agent-token-file)
    issued_at: float | None = None  # unix time, controller clock
    by: str | None = None
    awaiting_approval: bool = False  # `llmgw ctl credentials approve NODE`
    # Its node has not reported with it yet: it expires then unless it does.
    expires_at: float | None = None


DEFAULT_ENROLL_TOKEN_TTL_S = 86_400.0  # as kubeadm's bootstrap tokens


class EnrollTokenRequest(Inbound):
    """`POST /v1/credentials/tokens`: make an enrollment token (`ctl credentials token create`)."""

    # How long it enrolls nodes; 0: no expiry (as kubeadm's --ttl 0).
    ttl_s: Seconds = DEFAULT_ENROLL_TOKEN_TTL_S
    uses: int | None = Field(default=None, ge=1, le=1_000_000)  # None: no use limit
    description: Annotated[str, _text(max_length=256)] | None = None


class EnrollTokenView(Outbound):
    id: str  # public: what `ctl credentials token delete ID` names
    state: str  # "valid" | "expired" | "used up"
    created_at: float  # unix time, controller clock
    by: str
    expires_at: float | None = None  # None: never
    uses: int | None = None  # None: no limit
    used: int = 0
    description: str | None = None
    token: str | None = None  # the secret: in the answer that made it, never again


# -- client keys of tenants (`ctl keys`; llmgw.tenant_keys) ----------------------------

TenantName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._-]{1,64}$")]
# A model name's characters and the shell-style glob's own.
ModelPattern = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._:/@+*?\[\]!-]{1,256}$")]
ClientKeyId = Annotated[str, StringConstraints(pattern=r"^[a-z0-9]{1,16}$")]


class ClientKeyRequest(Inbound):
    """`POST /v1/keys`: make a client key for a tenant (`ctl keys create`)."""

    tenant: TenantName
    # The models it allows (shell-style patterns); none given: every model.
    models: list[ModelPattern] = Field(default_factory=list, max_length=64)
    expires_s: Annotated[float, Field(gt=0, le=MAX_DURATION_S)] | None = None  # None: never


class ClientKeyView(Outbound):
    """What `ctl keys list` shows: never the key, nor its digest."""

    id: str
    tenant: str
    models: list[str]
    state: str  # "valid" | "expired"
    created_at: float  # unix time, controller clock
    by: str
    expires_at: float | None = None  # None: never
    last_used: float | None = None  # as the gateways reported it (to the minute)
    key: str | None = None  # the key: in the answer that made it, never again


class ClientKeyEntry(Outbound):
    """One key as a gateway gets it: its digest, never the key."""

    id: str
    tenant: str
    digest: str
    models: list[str]
    expires_at: float | None = None


class TenantLimitView(Outbound):
    """One limit (`ctl limits`): a tenant's, or a tenant's on one model (`model`);
    None where a kind is not limited. `budget` tokens per `per` (UTC day or month)."""

    tenant: str
    model: str | None = None
    rpm: int | None = None
    tpm: int | None = None
    budget: int | None = None
    per: str | None = None  # "day" | "month", with a budget
    by: str = ""
    at: float = 0.0


class ClientKeysFeed(Outbound):
    """`GET /v1/keys/feed`: every key (they are few), every tenant's limits, and the
    cursor to wait past."""

    cursor: str
    keys: list[ClientKeyEntry]
    limits: list[TenantLimitView] = Field(default_factory=list)


LimitPeriod = Literal["day", "month"]
MAX_RPM = 10**9
MAX_TOKENS = 10**15


class LimitRequest(Inbound):
    """`PUT /v1/limits` (`ctl limits set`): the kinds given replace the scope's, the
    others stay as they were."""

    tenant: TenantName
    model: ModelName | None = None  # None: all the tenant's models together
    rpm: Annotated[int, Field(ge=1, le=MAX_RPM)] | None = None
    tpm: Annotated[int, Field(ge=1, le=MAX_TOKENS)] | None = None
    budget: Annotated[int, Field(ge=1, le=MAX_TOKENS)] | None = None
    per: LimitPeriod | None = None

    @model_validator(mode="after")
    def _something(self) -> LimitRequest:
        if self.rpm is None and self.tpm is None and self.budget is None:
            raise ValueError("give at least one of rpm, tpm, budget")
        if (self.budget is None) != (self.per is None):
            raise ValueError("a budget goes with its period (per: day or month), and only it")
        return self


_Count = Annotated[int, Field(ge=0, le=2**53)]


class UsageDelta(Inbound):
    """What one (tenant, model) cost at one gateway since its last batch."""

    tenant: TenantName
    model: ModelName
    requests: _Count = 0
    prompt_tokens: _Count = 0
    completion_tokens: _Count = 0
    errors: _Count = 0
    rate_limited: _Count = 0  # refused over a limit (429), never sent on


class UsageBatch(Inbound):
    """`POST /v1/gateways/usage`: a gateway's counts, each second. `seq` counts the
    batches of the gateway's `run` (one process): a batch sent again, its answer
    lost, is counted once."""

    name: Annotated[
        str, StringConstraints(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._:@-]+$")
    ]
    run: Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
    seq: Annotated[int, Field(ge=1, le=2**62)]
    rows: list[UsageDelta] = Field(default_factory=list, max_length=20_000)


class LimitShare(Outbound):
    """What the fleet spent against one limit's scope: the other gateways' requests
    and tokens (running totals of the controller's `run`) and, with a budget, the
    tokens of its period so far, every gateway's."""

    tenant: str
    model: str | None = None
    others_requests: int = 0
    others_tokens: int = 0
    budget_used: int | None = None


class UsageAnswer(Outbound):
    run: str
    shares: list[LimitShare] = Field(default_factory=list)


class UsageRow(Outbound):
    """`GET /v1/usage` (`ctl usage`): one (tenant, model)'s counts in the window."""

    tenant: str
    model: str
    requests: int
    prompt_tokens: int
    completion_tokens: int
    errors: int
    rate_limited: int = 0


class UsageReport(Outbound):
    since: float  # the window's start: the hour `--since` falls in (unix time)
    rows: list[UsageRow]


class EmptyRequest(Inbound):
    """A body that carries nothing: `{}` or no body at all."""


class UncordonRequest(Inbound):
    """`{}` or no body; `force`: uncordon although llmgw cordoned the node for a card
    that is still unhealthy."""

    force: bool = False


MAX_FORCE_AFTER_S = 7 * 86_400


class DrainRequest(Inbound):
    reason: Reason
    force: bool = False
    # Force the drain this many seconds from now unless it is done by then.
    force_after_s: Annotated[float, Strict()] | None = Field(
        default=None, gt=0, le=MAX_FORCE_AFTER_S, allow_inf_nan=False
    )


class ModelSpec(Inbound):
    name: ModelName
    source: PathText  # what the engine loads: a repository id or a path
    min_replicas: int = Field(default=1, ge=0, le=10_000)
    gpus_per_shard: int = Field(default=1, ge=1, le=64)
    shards: int = Field(default=1, ge=1, le=256)  # nodes per replica
    gpu_class: GpuClass | None = None
    engine: EngineName = "vllm"
    engine_args: list[Annotated[str, _text(max_length=1024)]] = Field(
        default_factory=list, max_length=256
    )
    # A rollout of a changed spec: at most this many replicas above the desired
    # count at once, and at most this many ready replicas below it.
    max_surge: int = Field(default=1, ge=0, le=10_000)
    max_unavailable: int = Field(default=0, ge=0, le=10_000)
    # Demand (`llmgw.controller.core.autoscale`): between min_replicas and max_replicas
    # (None: min_replicas, no autoscaling), aiming at target_in_flight requests in
    # flight per replica; down one replica at a time, each after the demand has
    # stayed lower for scale_down_after_s (unloading throws the KV cache away).
    max_replicas: int | None = Field(default=None, ge=0, le=10_000)
    target_in_flight: int = Field(default=8, ge=1, le=1_000_000)
    scale_down_after_s: Annotated[float, Strict()] = Field(
        default=600.0, ge=0, le=MAX_FORCE_AFTER_S, allow_inf_nan=False
    )
    priority: int = Field(default=0, ge=-1_000_000, le=1_000_000)
    # The warm tier (issue 32): a ready replica idle this long sleeps instead of
    # stopping (None: never; nothing changes for a spec that does not ask), at
    # `sleep_level` (1: weights kept in host memory; 2: dropped, reloaded on waking;
    # auto: 1 when the node's host memory holds the weights, else 2), and is stopped
    # after `stop_asleep_after_s` asleep (None: never), never below the model's minimum
    # or desired count.
    sleep_after_s: Annotated[float, Strict()] | None = Field(
        default=None, ge=0, le=MAX_FORCE_AFTER_S, allow_inf_nan=False
    )
    sleep_level: Literal[1, 2, "auto"] = "auto"
    stop_asleep_after_s: Annotated[float, Strict()] | None = Field(
        default=None, ge=0, le=MAX_FORCE_AFTER_S, allow_inf_nan=False
    )

    @property
    def sleeps(self) -> bool:
        """Its idle replicas sleep instead of stopping."""
        return self.sleep_after_s is not None

    @model_validator(mode="after")
    def _a_rollout_can_move(self) -> ModelSpec:
        if self.max_surge == 0 and self.max_unavailable == 0:
            raise ValueError(
                "max_surge and max_unavailable cannot both be 0: a rollout could neither "
                "add a new replica nor stop an old one"
            )
        if self.max_replicas is not None and self.max_replicas < self.min_replicas:
            raise ValueError(
                f"max_replicas ({self.max_replicas}) is below min_replicas "
                f"({self.min_replicas}): raise max_replicas, or leave it out for a fixed count"
            )
        return self

    @property
    def most_replicas(self) -> int:
        """The most replicas demand may ask for (min_replicas without autoscaling)."""
        return self.min_replicas if self.max_replicas is None else self.max_replicas

    @property
    def autoscaled(self) -> bool:
        return self.most_replicas > self.min_replicas


class EventReason(StrEnum):
    """Why the controller did something by itself (`ctl events`, `/metrics`)."""

    PLACED = "Placed"  # replicas placed for a model short of its minimum
    STAND_IN = "StandIn"  # a stand-in placed for a replica that must move (drain, fault)
    MOVED = "Moved"  # a moved replica stopped once its stand-in served
    ROLLOUT = "RolloutStep"  # a rollout placed a new replica or let an old one go
    ROLLOUT_STALLED = "RolloutStalled"
    DRAIN_FORCED = "DrainForced"  # a drain's deadline passed
    DRAINED = "Drained"
    GPU_FAULT = "GpuFault"  # a node cordoned for a failed card
    BACK_OFF = "BackOff"  # a model's replica failed: its next placement waits
    NODE_LOST = "NodeLost"  # replicas of a node unreachable too long, replaced
    UNPLACEABLE = "Unplaceable"  # a model short of its minimum that cannot be placed
    ENROLLED = "Enrolled"  # a node traded an enrollment token for its credential
    AWAITING_APPROVAL = "AwaitingApproval"  # enrolled; no replicas until an admin approves
    ENROLL_REFUSED = "EnrollRefused"  # an enrollment of a node that exists was refused
    STOPPED = "Stopped"  # replicas of a deleted model stopped
    SCALED_UP = "ScaledUp"  # demand raised a model's desired replicas
    SCALED_DOWN = "ScaledDown"  # demand stayed lower: one replica leaves, or has stopped
    RECLAIMED = "Reclaimed"  # replicas stopped to make room for a higher-priority model
    CREDENTIAL_EXPIRED = "CredentialExpired"  # issued, never reported with: dropped
    SLEPT = "Slept"  # an idle replica put to sleep (its model's sleep_after_s)
    WOKE = "Woke"  # a sleeping replica woken for its model's requests
    SLEEP_FAILED = "SleepFailed"  # a replica that could not sleep: kept awake
    GATEWAY_CLAMPED = "GatewayClamped"  # a gateway said more was in flight than it admits
    ADAPTER_LOADED = "AdapterLoaded"  # a replica's engine holds a LoRA adapter it was told to
    ADAPTER_UNLOADED = "AdapterUnloaded"  # told to let one go (idle, or room for another)
    ADAPTER_LOAD_FAILED = "AdapterLoadFailed"  # the engine refused a load: its words
    # A sleeping replica whose cards hold a busy awake engine: stopped, and its
    # model's requests served by a replica placed afresh (a cold or warm start)
    NO_ROOM_TO_WAKE = "NoRoomToWake"


class EventView(Outbound):
    """One event, or a run of repeats counted as one (llmgw.controller.state.events): an
    event with `count` > 1 replaces the newest earlier event of the same object and
    reason, which a client that holds it drops."""

    id: int  # increasing, durable: `GET /v1/events?since=ID` answers the ones after it
    at: float  # unix time, controller clock; of the last repeat when counted
    object: str  # node/NAME, model/NAME or replica/ID
    reason: EventReason
    message: str  # the last repeat's
    count: int = 1  # how many times it happened
    first_at: float | None = None  # the first time, when it happened more than once


class EventList(Outbound):
    events: list[EventView]  # oldest first
    cursor: int  # the newest id answered (or `since` when none): pass it back as since=


class RolloutUndo(Inbound):
    """`POST /v1/models/{name}/undo`: back to what revision N ran (None: the one before)."""

    to_revision: int | None = Field(default=None, ge=1)


class AdapterSpec(Inbound):
    """A LoRA adapter (issue 33): served by replicas of its `base` model, loaded there
    by demand. `source`: the adapter's directory as the agents find it in their
    `--storage` (a name like a model's, org/name), or an absolute path."""

    name: ModelName
    base: ModelName
    source: PathText


class ModelSpecList(Inbound):
    models: list[ModelSpec] = Field(max_length=10_000)
    # Adapters declared in the same files (an entry with `base:`).
    adapters: list[AdapterSpec] = Field(default_factory=list, max_length=10_000)


# -- views the controller serves -------------------------------------------------


class AdminInfo(Outbound):
    flag: AdminFlag = AdminFlag.NONE
    reason: str | None = None
    by: str | None = None
    at: float | None = None  # unix time, controller clock
    drained: bool = False  # a drain finished: cordoned, marked drained
    force: bool = False  # a drain that stops replicas without waiting for replacements
    force_at: float | None = None  # unix time, controller clock: the drain is forced then
    # Enrolled and not approved yet (--enroll-approval): cordoned by llmgw until
    # `llmgw ctl credentials approve NODE`.
    awaiting_approval: bool = False


class AdminEvent(Outbound):
    node: str
    action: str  # cordon | uncordon | drain | drain forced (deadline) | drained | forget
    reason: str | None
    by: str
    at: float
    force_at: float | None = None  # a drain's deadline, as it was set


class NodeRow(Outbound):
    """One line of the nodes table: small, so 2,000 of them stay cheap."""

    name: str
    state: NodeState
    admin: AdminInfo
    report_age_s: float | None  # None: no report since the controller started
    classes: dict[str, int]  # gpu class -> cards
    gpus_total: int
    gpus_used: int
    gpus_unhealthy: int
    gpus_unknown: int
    fabrics: list[str]
    models: list[str]  # complete weights held
    replicas: int
    gpu_error: str | None = None
    drain_blocked: str | None = None  # why a drain is not progressing


class NodesDelta(Outbound):
    """`GET /v1/nodes?since=CURSOR`: the rows that changed since a cursor.

    Like a Kubernetes list-then-watch: pass `since=` (empty) for everything,
    then each answer's `cursor` to get only what changed after it. A cursor
    from another controller run (or one not yet issued) gets a full answer.
    A row counts as changed when anything but its report age changed; every
    node's current age is in `report_ages`, so rows that did not change are
    not sent again just because their node reported.
    """

    cursor: str  # pass back as ?since= next time
    full: bool  # `nodes` is every node: drop anything not in it
    nodes: list[NodeRow]  # changed (or, when full, all) rows, by name
    removed: list[str] = Field(default_factory=list)  # nodes the controller forgot
    report_ages: dict[str, float | None]  # every node; None: no report this run


class NodeDetail(Outbound):
    row: NodeRow
    gpus: list[GpuReport]
    storage_configured: bool
    storage: list[StorageLocation]
    replicas: list[ReplicaReport]
    history: list[AdminEvent]
    agent_version: str | None = None
    address: str | None = None


class ShardView(Outbound):
    node: str
    rank: int
    gpus: list[str]
    state: ShardState | None = None  # None: the node has not reported it yet
    idle_seconds: float | None = None
    error: str | None = None


class ReplicaView(Outbound):
    id: str
    model: str
    state: ReplicaState
    shards: list[ShardView]
    gpus: int
    idle_seconds: float | None
    created_at: float
    error: str | None = None
    replaces: str | None = None  # the replica this one stands in for (drain)
    url: str | None = None  # its rank-0 engine, while in routing (the gateway's endpoint)
    revision: int = 0  # the model's revision it runs
    # Not confirmed yet: its state is the last known one, its nodes not heard from since
    # this controller began to lead (a restart, a failover). Seconds it is kept so at
    # most: then they report, or turn unreachable. None: confirmed by its nodes.
    unconfirmed_s: float | None = None


class ModelRevision(Outbound):
    """One revision of a model: the spec its engines were started with, and why."""

    revision: int
    at: float  # unix time, controller clock
    by: str
    change: str  # e.g. "engine_args: --load-seconds 5 -> --load-seconds 6"
    spec: ModelSpec


class ScalingState(StrEnum):
    """Where demand has an autoscaled model (the message beside it says the figures)."""

    FOLLOWING = "following"  # up and down with requests in flight
    WAKING = "waking"  # woken from zero replicas by a request; none serves yet
    ASLEEP = "asleep"  # at zero replicas until a request comes


class RolloutState(StrEnum):
    COMPLETE = "complete"  # every replica runs the current revision
    PROGRESSING = "progressing"
    WAITING = "waiting"  # no room for a new replica: `message` says why
    STALLED = "stalled"  # a replica of the new revision failed: no more old ones stop


class RolloutView(Outbound):
    revision: int
    state: RolloutState
    desired: int
    updated: int  # ready replicas of the current revision
    outdated: int  # replicas of older revisions still running
    message: str | None = None


class ModelView(Outbound):
    spec: ModelSpec
    ready: int
    starting: int
    failed: int
    satisfied: bool
    unplaceable_reason: str | None = None
    last_failure: str | None = None
    # Distinct nodes under its serving (ready or draining) replicas: ready >= 2 on
    # 1 node means one node's failure takes the whole model (ctl, the console flag it).
    nodes: int = 0
    rollout: RolloutView | None = None
    # Demand: the replicas it should have now (min_replicas without autoscaling),
    # its requests in flight (smoothed, as the autoscaler reads them) and why the
    # count is what it is (`in flight 12, target 4 -> 3`; a scale-up that waits).
    desired: int = 0
    in_flight: float = 0.0
    scaling: str | None = None
    scaling_state: ScalingState | None = None  # None: not autoscaled (or a controller before it)
    # The warm tier: replicas asleep (holding their cards, serving nothing) and waking.
    # They count for `satisfied`: a request wakes one in seconds.
    sleeping: int = 0
    waking: int = 0
    # Replicas counted in their last known state, their nodes not heard from since this
    # controller began to lead, and the most seconds that lasts (ReplicaView.unconfirmed_s).
    unconfirmed: int = 0
    unconfirmed_s: float | None = None


class AdapterView(Outbound):
    """One adapter: its spec, where it is loaded and what it serves (issue 33)."""

    spec: AdapterSpec
    loaded_on: list[str] = Field(default_factory=list)  # replica ids that hold it
    loading_on: list[str] = Field(default_factory=list)  # told to load, not yet reported
    nodes_with_files: int = 0  # nodes whose storage holds it complete
    in_flight: int = 0
    requests: int = 0
    held: int = 0
    last_used_s: float | None = None  # seconds since a request for it (None: never seen)
    last_failure: str | None = None


class AdapterDryRun(Outbound):
    spec: AdapterSpec
    current: AdapterSpec | None = None


class ModelDryRun(Outbound):
    """`POST /v1/models?dry_run=true`: a spec as the controller would store it,
    beside the one it holds now (None: it would be created); nothing is written."""

    spec: ModelSpec
    current: ModelSpec | None = None
    new_revision: bool  # a field the engine sees changes: new replicas are rolled out


# -- the fleet summary (a wire contract: fields may be added, never removed) ----


class NodeCounts(Outbound):
    total: int
    ready: int
    cordoned: int
    draining: int
    unreachable: int


class GpuClassCounts(Outbound):
    gpu_class: str = Field(alias="class", serialization_alias="class")
    total: int
    used: int
    unhealthy: int
    # Added fields. Every card is in exactly one bucket:
    # total = used + unhealthy + unknown + unschedulable + free
    unknown: int = 0  # health not readable: never counted as free
    unschedulable: int = 0  # healthy, unused, but on a node that takes no new work
    free: int = 0  # healthy, unused, on a ready node


class FabricModelCopies(Outbound):
    model: str
    local_copies: int  # nodes holding it on local storage
    shared_copies: int  # distinct shared filers (mount sources) holding it
    nodes: int  # nodes that can read it


class FabricSummary(Outbound):
    fabric: str
    nodes: int
    nodes_with_weights: int
    models_present: int
    largest_free_block: int
    copies: list[FabricModelCopies] = Field(default_factory=list)


class ReplicaCounts(Outbound):
    ready: int = 0
    starting: int = 0
    draining: int = 0
    failed: int = 0
    sleeping: int = 0  # the warm tier: holding their cards, serving nothing
    waking: int = 0


class ModelCounts(Outbound):
    total: int
    satisfied: int
    short: int


class IdleReplica(Outbound):
    id: str
    model: str
    idle_seconds: float
    gpus: int


class SleepingReplica(Outbound):
    """A replica asleep (the warm tier): it holds its cards' residual memory and its
    engine process, serves nothing, and wakes in seconds for its model's requests."""

    id: str
    model: str
    asleep_seconds: float
    gpus: int


class ModelTraffic(Outbound):
    """What a model's serving replicas served over the engines' last window.

    Requests and in-flight are sums over replicas (in flight: the engine's own
    count, or the gateways' when higher). Latency and hit rate are per-replica
    figures weighted by each replica's requests: engines export histograms and
    counters, and the agents report each engine's window, not its raw samples."""

    model: str
    replicas: int  # serving replicas with figures
    requests_per_s: float
    in_flight: int
    p50_latency_s: float | None
    prefix_hit_rate: float | None
    p50_metric: str | None = None  # as EngineTraffic's, when every replica says the same
    p50_upper_bound: bool = False  # every replica's median was below its first bucket


class ReasonGroup(Outbound):
    """Nodes sharing one admin reason, as `sinfo -R` lists them."""

    reason: str
    flag: AdminFlag
    by: str | None
    at: float | None
    nodes: list[str]


class WakingModel(Outbound):
    model: str
    seconds: float  # since the first held request woke it
    held: int  # requests the gateways hold for it


IDLE_AFTER_S = 600.0  # idle means nothing asked for at least 10 minutes (--idle-after)


class FleetSummary(Outbound):
    nodes: NodeCounts
    gpus: list[GpuClassCounts]
    fabrics: list[FabricSummary]
    replicas: ReplicaCounts
    models: ModelCounts
    unplaceable: list[str]
    idle_replicas: list[IdleReplica]
    # added fields
    unplaceable_reasons: dict[str, str] = Field(default_factory=dict)
    reasons: list[ReasonGroup] = Field(default_factory=list)
    generated_at: float = 0.0  # controller clock
    traffic: list[ModelTraffic] = Field(default_factory=list)  # models with figures, by name
    # engine -> reachable nodes whose agent can run it (agents that say so)
    engines: dict[str, int] = Field(default_factory=dict)
    # Models woken from zero replicas that none serves yet, by name.
    waking: list[WakingModel] = Field(default_factory=list)
    # What `idle_replicas` means: ready and asked nothing for this long (`--idle-after`).
    idle_after_s: float = IDLE_AFTER_S
    # Each declared LoRA adapter: where it is loaded, what it serves, when last used.
    adapters: list[AdapterView] = Field(default_factory=list)
    # Replicas asleep, the longest asleep first: the cards they hold are the first
    # to share (a card's room beside them) after the idle ones.
    sleeping_replicas: list[SleepingReplica] = Field(default_factory=list)


# -- drain pre-check ----------------------------------------------------------------


class DrainPlanRequest(Inbound):
    nodes: list[NodeName] = Field(min_length=1, max_length=10_000)


class DrainImpact(Outbound):
    """What draining some nodes would do to one model."""

    model: str
    min_replicas: int
    ready_now: int
    replicas_on_nodes: int  # replicas that would have to move
    replaceable: int  # of those, how many the scheduler can place elsewhere now
    verdict: str  # "ok" | "below_minimum" | "unplaceable"
    reason: str | None = None


class DrainPlan(Outbound):
    nodes: list[str]
    replicas_to_move: int
    impacts: list[DrainImpact]  # only models with replicas on the nodes, worst first


# -- the gateway (endpoint feed and gateway status) ----------------------------------

# Keys a gateway sends are replica ids: no control characters, as everywhere.
GatewayReplicaId = ReplicaId


class Endpoint(Outbound):
    replica_id: str
    model: str
    url: str  # the rank-0 engine: http://NODE-ADDRESS:PORT
    node: str
    fabric: str | None
    state: Literal["serving", "stopping"]
    adapters: list[str] = Field(default_factory=list)  # LoRA adapters it holds, routable


class UnservedKind(StrEnum):
    """Why a declared model has no serving endpoint, as a gateway acts on it."""

    NOT_READY = "not_ready"  # replicas are on their way (or will be): 503, retry
    ASLEEP = "asleep"  # at zero replicas, woken by a request: hold requests while it wakes
    UNPLACEABLE = "unplaceable"  # no replica can be placed now: 503, retrying will not help


class Unserved(Outbound):
    """A declared model no replica serves: the kind code reads, the message people read."""

    kind: UnservedKind
    message: str  # "2 replicas starting"; "needs 1 node x 8 H100-80GB ..."

    @field_validator("kind", mode="before")
    @classmethod
    def _unknown_kind(cls, value: object) -> object:
        # A kind from a newer controller reads as "not ready" (503, retry): one new
        # word must not stop a gateway from following the feed.
        known = {k.value for k in UnservedKind}
        return value if not isinstance(value, str) or value in known else UnservedKind.NOT_READY

    def legacy_text(self) -> str:
        """The reason as `EndpointsDelta.unserved` says it to 0.1 gateways."""
        prefix = _LEGACY_PREFIXES.get(self.kind, "")
        return prefix + self.message

    @classmethod
    def from_legacy_text(cls, text: str) -> Unserved:
        """An older controller's reason (`unserved` alone), read back as its words say.
        The only place a reason is recognised by its text; it goes with that field."""
        for kind, prefix in _LEGACY_PREFIXES.items():
            if text.startswith(prefix):
                return cls(kind=kind, message=text.removeprefix(prefix))
        return cls(kind=UnservedKind.NOT_READY, message=text)


# How the text-only `unserved` field marked two kinds; the others had no prefix.
_LEGACY_PREFIXES = {UnservedKind.UNPLACEABLE: "cannot be placed: ", UnservedKind.ASLEEP: "asleep: "}


class EndpointsDelta(Outbound):
    """Endpoints that changed after `since` (every one when `full`), and ids gone.

    `unserved_reasons` names each declared model with no serving endpoint and says
    why, so that a gateway can answer its clients in words and act on the kind."""

    cursor: str
    full: bool
    endpoints: list[Endpoint]
    removed: list[str]
    # The same reasons as text only (`Unserved.legacy_text`), for 0.1 gateways, which
    # read nothing else. Both fields are sent through 0.2 (one release back is
    # understood); `unserved` goes in 0.3, with `Unserved.from_legacy_text`.
    unserved: dict[str, str] = Field(default_factory=dict)
    unserved_reasons: dict[str, Unserved] = Field(default_factory=dict)
    # Every declared adapter -> its base (always whole: they are few beside endpoints).
    adapters: dict[str, str] = Field(default_factory=dict)

    @classmethod
    def build(
        cls,
        cursor: str,
        full: bool,
        endpoints: list[Endpoint],
        removed: list[str],
        unserved: dict[str, Unserved],
        adapters: dict[str, str] | None = None,
    ) -> EndpointsDelta:
        """A delta that says each unserved reason in both fields."""
        return cls(
            cursor=cursor,
            full=full,
            endpoints=endpoints,
            removed=removed,
            unserved={m: r.legacy_text() for m, r in unserved.items()},
            unserved_reasons=unserved,
            adapters=adapters or {},
        )

    def reasons(self) -> dict[str, Unserved]:
        """Why each model is unserved: the structured reason, or, from a 0.1
        controller (text only), the text read back (goes with `unserved` in 0.3)."""
        older = {m: Unserved.from_legacy_text(t) for m, t in self.unserved.items()}
        return older | self.unserved_reasons


# The most a gateway may say it admits at once (`llmgw gateway --max-in-flight`).
GATEWAY_IN_FLIGHT_BOUND = 1_000_000
# What a gateway that does not say is taken to admit: SMG's own least bound (1,024
# per core, at least 4,096).
GATEWAY_IN_FLIGHT_DEFAULT = 4096


class GatewayStatus(Inbound):
    name: Annotated[
        str, StringConstraints(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._:@-]+$")
    ]
    cursor: Annotated[str, StringConstraints(max_length=80)] = ""  # applied: SMG follows it
    # A later cursor whose new workers SMG routes to while removals are pending (sent
    # only then): a model it declared is answered by its explainer, never a 404.
    routed: Annotated[str, StringConstraints(max_length=80)] = ""
    in_flight: dict[GatewayReplicaId, Annotated[int, Field(ge=0, le=10_000_000)]] = Field(
        default_factory=dict, max_length=100_000
    )
    requests: dict[GatewayReplicaId, Annotated[int, Field(ge=0, le=2**62)]] = Field(
        default_factory=dict, max_length=100_000
    )
    # Endpoints it leaves out of routing because it cannot use them, and why.
    rejected: dict[GatewayReplicaId, Annotated[str, _text(1, 200)]] = Field(
        default_factory=dict, max_length=1024
    )
    # Replicas the feed says are stopping that its SMG no longer routes to (their workers
    # gone from SMG's list): a stop of one waits for nothing else of this gateway's, not
    # for the cursor, which a slow change of another model can hold back.
    released: list[GatewayReplicaId] = Field(default_factory=list, max_length=100_000)
    # Requests it holds per model asleep at zero replicas, waiting for one to wake.
    held: dict[ModelName, Annotated[int, Field(ge=0, le=1_000_000)]] = Field(
        default_factory=dict, max_length=10_000
    )
    # Its concurrency bound (`llmgw gateway --max-in-flight`, SMG's admission limit):
    # the controller counts at most this many of its requests in flight and held.
    max_in_flight: Annotated[int, Field(ge=1, le=GATEWAY_IN_FLIGHT_BOUND)] | None = None
    # Requests for each adapter it forwarded in flight now, and forwarded in all.
    adapter_in_flight: dict[ModelName, Annotated[int, Field(ge=0, le=10_000_000)]] = Field(
        default_factory=dict, max_length=10_000
    )
    adapter_requests: dict[ModelName, Annotated[int, Field(ge=0, le=2**62)]] = Field(
        default_factory=dict, max_length=10_000
    )
    # Client keys used since the last status (key id -> unix time, the gateway's clock).
    keys_used: dict[ClientKeyId, Annotated[float, Field(ge=0, le=1e11)]] = Field(
        default_factory=dict, max_length=10_000
    )


class GatewayView(Outbound):
    name: str
    cursor: str
    age_s: float
    in_flight: int
    requests: int
    rejected: dict[str, str] = Field(default_factory=dict)  # replica id -> why left out


class WhoAmI(Outbound):
    """`GET /v1/whoami`: whose token this is and what it may do (None: open mode)."""

    name: str
    role: str | None
