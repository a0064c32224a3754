"""llmgw: a fleet console and node agent for GPU clusters that serve LLMs."""

from __future__ import annotations

__version__ = "0.1.0"
