"""The programs `llmgw` runs, by subcommand: read by the CLI entry (to dispatch)
and by shell completion (to complete), neither importing the other."""

from __future__ import annotations

# subcommand -> (module, help)
PROGRAMS: dict[str, tuple[str, str]] = {
    "controller": ("llmgw.controller.main", "run the controller (aggregates reports, admin API)"),
    "agent": (
        "llmgw.agent.cli",
        "run the node agent (observes GPUs, fabrics, weights; runs engines)",
    ),
    "console": ("llmgw.console.cli", "open the live fleet console"),
    "ctl": ("llmgw.ctl", "one-shot commands: status, nodes, cordon, drain, apply, ..."),
    "demo": ("llmgw.demo", "a whole simulated fleet on this machine"),
    "completion": ("llmgw.completion", "print shell completion: llmgw completion bash|zsh"),
    "gateway": ("llmgw.gateway.main", "the OpenAI-compatible endpoint (SMG) following placement"),
}
