"""Who runs this command, as the history records an operator: the user behind sudo, else the login user.

`repair approve` and `health clear` on the node record this name. A command that acts for an operator elsewhere (the
page, `health clear NODE` from the controller) records the name of the operator's token instead: there the Unix
user is the page's, not the operator's.
"""

from __future__ import annotations

import os
import pwd

__all__ = ["invoking_user"]


def invoking_user() -> str:
    """SUDO_USER when root runs it through sudo (believed only from root: anyone may set the variable), else the
    login name of this process's user (`uid N` when the password database has none)."""
    if os.getuid() == 0 and os.environ.get("SUDO_USER"):
        return os.environ["SUDO_USER"]
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return f"uid {os.getuid()}"
