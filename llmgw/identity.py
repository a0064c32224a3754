"""Who is acting: the one rule ctl and the console use for the name they send the
controller in X-LLMGW-User, so the same person is recorded the same way by both.

The controller records a named token's name, with this name beside it when the two
differ, and this name alone on an open controller (where it was `anonymous` for the
console and the login name for ctl).
"""

from __future__ import annotations

import os
from collections.abc import Mapping


def operator_name(env: Mapping[str, str] | None = None) -> str | None:
    """The OS user running the command; under sudo, the user who ran sudo.

    None when the system cannot say (no passwd entry in some containers): the
    controller then records the token's name, or `anonymous`.
    """
    env = os.environ if env is None else env
    sudo_user = env.get("SUDO_USER", "").strip()
    if sudo_user and os.geteuid() == 0:
        return sudo_user
    for name in ("LOGNAME", "USER", "LNAME", "USERNAME"):  # getpass.getuser's order
        if user := os.environ.get(name):
            return user
    import getpass  # (its import loads termios: a one-shot `ctl` pays it only here)

    try:
        return getpass.getuser() or None
    except Exception:  # getpass raises OSError, or KeyError from pwd, when it cannot say
        return None
