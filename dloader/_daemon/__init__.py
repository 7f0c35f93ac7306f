"""What both daemons (``dloader-sidecar``, ``dloader-allocator``) are built on.

* :mod:`dloader._daemon.server`: the gRPC server with dloader's conventions (one interceptor
  mapping :class:`dloader.errors.RequestError` to status codes, the bearer-token check on TCP,
  TLS, health and reflection, message size caps), and :class:`ListenConfig`;
* :mod:`dloader._daemon.store`: the SQLite base (WAL, a lock, a settings table, a schema
  version with ordered migrations);
* :mod:`dloader._daemon.run`: signals and the daemon entry point (a bad setting exits 2 with
  its message).

Neither daemon imports the other; both import this package. Clients use
:mod:`dloader._shared.client`.
"""

from dloader._daemon.run import add_daemon_arguments, run_daemon, shut_down, stop_on_signals
from dloader._daemon.server import MAX_MESSAGE_BYTES, ErrorInterceptor, ListenConfig, start_server
from dloader._daemon.store import SqliteState

__all__ = [
    "MAX_MESSAGE_BYTES",
    "ErrorInterceptor",
    "ListenConfig",
    "SqliteState",
    "add_daemon_arguments",
    "run_daemon",
    "shut_down",
    "start_server",
    "stop_on_signals",
]
