"""`slurm-ext web`: the page on waitress, its watcher started and stopped with it.

waitress because it is a well-kept pure-Python WSGI server with a fixed pool of threads: a browser's poll is one
short request, and a slow client holds a buffer, not a thread. Its limits on a request's headers and body are the
page's own (`app.MAX_HEADERS`, `app.MAX_BODY`), not waitress's defaults (256 KiB, 1 GiB): waitress reads a body
before the app sees it, spooling it to a temporary file, and would do so for anyone, without a login. A larger
request is refused (413, 431) as soon as it shows (a Content-Length too large: from the headers alone) and its
connection closed. SIGTERM (the agent's stop) closes it.
"""

from __future__ import annotations

import logging
import os
import signal

from slurm_ext import config as config_mod, credentials, events
from slurm_ext.errors import SlurmExtError

from .app import MAX_BODY, MAX_HEADERS, create_app
from .watch import Watcher

__all__ = ["serve", "make_server", "wsgi_server"]

log = logging.getLogger("web")

#: requests served at once (polls are short; an operation waits on an agent for a few seconds at most)
_THREADS = 8


def make_server(config, listen: str | None = None):
    """(waitress server, watcher) for `config`, listening on `listen` (host:port) or web.listen; the caller runs
    `server.run()` and stops both.

    Raises:
        SlurmExtError: the address cannot be listened on (the message names it).
    """
    host, _, port = (listen or config.web.listen).rpartition(":")
    watcher = Watcher(config).start()
    try:
        server = wsgi_server(create_app(config, watcher), host.strip("[]"), int(port))
    except OSError as err:
        watcher.stop()
        raise SlurmExtError(f"web: cannot listen on {host}:{port}: {err.strerror or err} (another page running? "
                            "set web.listen or --listen)") from err
    except BaseException:  # a config the app refuses: the watcher's thread must not keep the process
        watcher.stop()
        raise
    return server, watcher


def wsgi_server(app, host: str, port: int):
    """The waitress server of `app` on host:port, as the page runs it (the tests serve through it too).

    clear_untrusted_proxy_headers with no trusted_proxy: every X-Forwarded-* header is dropped before the app
    sees it, so the app never takes the scheme or host from a client (the cookies' Secure comes from
    web.oidc_redirect_url, app.secure)."""
    from waitress.server import create_server
    # waitress refuses a body of max_request_body_size bytes or more: the app's own largest is let through
    return create_server(app, host=host, port=port, threads=_THREADS, ident="slurm-ext",
                         clear_untrusted_proxy_headers=True, max_request_body_size=MAX_BODY + 1,
                         max_request_header_size=MAX_HEADERS)


def serve(config_path: str | None = None, listen: str | None = None) -> int:
    """The entry point of `slurm-ext web`: serve until SIGTERM or SIGINT."""
    config = credentials.adopt(config_mod.load(config_path), os.environ)  # the copies the agent made for the page
    if os.geteuid() == 0:
        log.warning("web: the page runs as root, beside slurmctld's key and the database passwords: not "
                    "recommended (web.user, default slurm-ext-web: docs/operator/web.md)")
    server, watcher = make_server(config, listen)
    where = f"http://{server.effective_host}:{server.effective_port}/"
    emit = events.emitter(config.node.state_dir, "web")
    emit("web-started", f"cluster page on {where}: Slurm read every {config.web.refresh:g}s while someone looks; "
                        + ("operations by token (" + config.web.token_file + ")" if config.web.token_file else
                           "no token file")
                        + (f", or by {config.web.proxy_user_header} from {', '.join(config.web.trusted_proxies)}"
                           if config.web.proxy_user_header else "")
                        + (f"; sign-in with {config.oidc.issuer} as client {config.web.oidc_client_id} (viewing: "
                           f"{config.web.viewing})" if config.web.oidc_client_id and config.oidc.issuer else ""))
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: server.close())
    try:
        server.run()
    except (OSError, ValueError):  # closed by the signal: the loop's descriptors are gone
        pass
    finally:
        watcher.stop()
    return 0
