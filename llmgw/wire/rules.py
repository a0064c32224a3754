"""The rules every wire type keeps: text without control characters, bounded
scalars (names, sizes, durations, addresses), the base models, and validating a
JSON body against a model."""

from __future__ import annotations

import ipaddress
import re
from enum import StrEnum
from typing import Annotated, Any, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    StringConstraints,
)
from pydantic_core import CoreConfig, SchemaValidator

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


def text_field(min_length: int | None = None, max_length: int = 256, **kw: Any) -> Any:
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
ShortText = Annotated[str, text_field(max_length=256)]
# Agent free text (errors, log tails): lines allowed, other controls refused.
Text = Annotated[str, StringConstraints(max_length=4096, pattern=LINES_ONLY_PATTERN)]
PathText = Annotated[str, text_field(1, 4096)]
Uuid = Annotated[str, text_field(1, 128)]
GpuClass = Annotated[str, text_field(1, 64)]
EngineName = Annotated[str, text_field(1, 64)]
ReplicaId = Annotated[str, text_field(1, 64)]
FabricName = Annotated[
    str, StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$")
]
Reason = Annotated[str, text_field(1, 1024, strip_whitespace=True)]
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
