"""`tunestudio serve [--host H] [--port P]`: the HTTP API, the event streams and the web page (tunestudio/api/),
imported only when this verb runs."""

from __future__ import annotations

from typing import Annotated

import typer

from tunestudio.cli.common import console, err, load_settings, open_manager


def serve(
    host: Annotated[str | None, typer.Option(help="Bind address (default 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default 8765).")] = None,
) -> None:
    """Serve the HTTP API, the event streams and the web page."""
    import uvicorn

    from tunestudio.api import create_app
    from tunestudio.api.http import server_config
    from tunestudio.api.security import check_bind

    settings = load_settings()
    host = host or settings.host
    port = port or settings.port
    try:
        check_bind(settings, host)
    except SystemExit as exc:
        err.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None
    # The app checks Host headers against the address it is really bound to.
    settings = settings.model_copy(update={"host": host, "port": port})
    manager = open_manager(settings, start=True)  # a damaged or read-only database: one line, before serving
    console.print(f"tunestudio on http://{host}:{port}  (API docs: /docs, data: {settings.data_dir()})")
    try:
        # A header read timeout and a connection cap (api/http.py): slow or idle sockets cannot hold the server.
        uvicorn.Server(server_config(create_app(settings, manager), settings, host, port)).run()
    finally:
        manager.close()
