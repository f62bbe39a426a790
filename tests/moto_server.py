"""A real S3 endpoint on loopback, so storage code runs its production boto3 path in tests."""

from collections.abc import Callable

from moto.server import ThreadedMotoServer

from tests.fakes.common import free_port

_HOST = "127.0.0.1"
_ATTEMPTS = 5


class _MotoServer(ThreadedMotoServer):
    """Reports a failed bind; the stock start() would otherwise wait forever for readiness."""

    startup_error: BaseException | None = None

    def _server_entry(self) -> None:
        try:
            super()._server_entry()
        except BaseException as exc:  # werkzeug calls sys.exit() when the port is taken
            self.startup_error = exc
            self._server_ready_event.set()


def start_moto_server() -> tuple[str, Callable[[], None]]:
    """Start moto on a free loopback port; returns (endpoint_url, stop)."""
    last_error: BaseException | None = None
    for _ in range(_ATTEMPTS):
        port = free_port()
        server = _MotoServer(ip_address=_HOST, port=port, verbose=False)
        server.start()
        if server.startup_error is None:
            return f"http://{_HOST}:{port}", server.stop
        last_error = server.startup_error
    raise RuntimeError(f"moto server did not start after {_ATTEMPTS} attempts") from last_error
