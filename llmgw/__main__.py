from __future__ import annotations

from llmgw.cli import main

raise SystemExit(main())
