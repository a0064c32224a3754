"""Every route of the controller's API: method, path, handler, and the roles that
may call it (`ROUTE_ROLES`, what the auth middleware checks)."""

from __future__ import annotations

from llmgw.controller.core.auth import (
    ADMIN_ROLES,
    AGENT_ROLES,
    ENDPOINT_READERS,
    ENROLL_ROLES,
    GATEWAY_ROLES,
    METRICS_ROLES,
    READ_ROLES,
    Role,
)
from llmgw.controller.http.handlers.client_keys import (
    client_keys_feed,
    create_client_key,
    list_client_keys,
    revoke_client_key,
)
from llmgw.controller.http.handlers.enrollment import (
    agent_enroll,
    allow_enroll,
    approve_credential,
    create_enroll_token,
    delete_enroll_token,
    list_credentials,
    list_enroll_tokens,
    revoke_credential,
)
from llmgw.controller.http.handlers.gateways import gateway_status, list_endpoints, list_gateways
from llmgw.controller.http.handlers.models import (
    delete_model,
    list_adapters,
    list_models,
    list_replicas,
    model_revisions,
    put_models,
    undo_rollout,
)
from llmgw.controller.http.handlers.nodes import (
    agent_assignments,
    agent_report,
    cordon,
    drain,
    drain_plan,
    forget_node,
    get_node,
    list_events,
    list_nodes,
    summary,
    uncordon,
)
from llmgw.controller.http.handlers.service import metrics, whoami
from llmgw.controller.http.handlers.tenants import (
    delete_limit,
    list_limits,
    set_limit,
    usage_batch,
    usage_report,
)
from llmgw.controller.http.keys import Handler

ROUTES: list[tuple[str, str, Handler, frozenset[Role]]] = [
    ("POST", "/v1/agent/report", agent_report, AGENT_ROLES),
    ("GET", "/v1/agent/assignments/{name}", agent_assignments, AGENT_ROLES),
    ("GET", "/v1/summary", summary, READ_ROLES),
    ("GET", "/v1/nodes", list_nodes, READ_ROLES),
    ("GET", "/v1/nodes/{name}", get_node, READ_ROLES),
    ("GET", "/v1/models", list_models, READ_ROLES),
    ("GET", "/v1/adapters", list_adapters, READ_ROLES),
    ("GET", "/v1/replicas", list_replicas, READ_ROLES),
    ("POST", "/v1/drain-plan", drain_plan, READ_ROLES),
    ("POST", "/v1/nodes/{name}/cordon", cordon, ADMIN_ROLES),
    ("POST", "/v1/nodes/{name}/uncordon", uncordon, ADMIN_ROLES),
    ("POST", "/v1/nodes/{name}/drain", drain, ADMIN_ROLES),
    ("POST", "/v1/models", put_models, ADMIN_ROLES),
    ("DELETE", "/v1/models/{name}", delete_model, ADMIN_ROLES),
    ("GET", "/v1/models/{name}/revisions", model_revisions, READ_ROLES),
    ("POST", "/v1/models/{name}/undo", undo_rollout, ADMIN_ROLES),
    ("POST", "/v1/agent/enroll", agent_enroll, ENROLL_ROLES),
    ("GET", "/v1/credentials", list_credentials, ADMIN_ROLES),
    ("DELETE", "/v1/credentials/{node}", revoke_credential, ADMIN_ROLES),
    ("POST", "/v1/credentials/{node}/approve", approve_credential, ADMIN_ROLES),
    ("POST", "/v1/credentials/{node}/allow", allow_enroll, ADMIN_ROLES),
    ("POST", "/v1/credentials/tokens", create_enroll_token, ADMIN_ROLES),
    ("GET", "/v1/credentials/tokens", list_enroll_tokens, ADMIN_ROLES),
    ("DELETE", "/v1/credentials/tokens/{id}", delete_enroll_token, ADMIN_ROLES),
    ("POST", "/v1/nodes/{name}/forget", forget_node, ADMIN_ROLES),
    ("GET", "/metrics", metrics, METRICS_ROLES),
    ("GET", "/v1/endpoints", list_endpoints, ENDPOINT_READERS),
    ("POST", "/v1/gateways/status", gateway_status, GATEWAY_ROLES),
    ("GET", "/v1/gateways", list_gateways, READ_ROLES),
    ("GET", "/v1/events", list_events, READ_ROLES),
    ("POST", "/v1/keys", create_client_key, ADMIN_ROLES),
    ("GET", "/v1/keys", list_client_keys, READ_ROLES),
    ("DELETE", "/v1/keys/{id}", revoke_client_key, ADMIN_ROLES),
    ("GET", "/v1/keys/feed", client_keys_feed, GATEWAY_ROLES),
    ("POST", "/v1/gateways/usage", usage_batch, GATEWAY_ROLES),
    ("GET", "/v1/usage", usage_report, READ_ROLES),
    ("PUT", "/v1/limits", set_limit, ADMIN_ROLES),
    ("GET", "/v1/limits", list_limits, READ_ROLES),
    ("DELETE", "/v1/limits/{tenant}", delete_limit, ADMIN_ROLES),
    ("GET", "/v1/whoami", whoami, frozenset(Role)),
]


# "METHOD /path/{template}" -> roles allowed; routes not listed (healthz) are public.
ROUTE_ROLES = {f"{method} {path}": roles for method, path, _, roles in ROUTES}
