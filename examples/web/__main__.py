"""`python -m examples.web [--addr HOST:PORT]`: the web producer, until SIGTERM or Ctrl-C."""

from __future__ import annotations

import argparse
import logging

from examples.web.server import serve


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m examples.web",
        description="POST /thumbnails enqueues a render; GET /thumbnails/<id> shows it. "
        "The database: FORKLIFT_DATABASE_URL, the schema: FORKLIFT_SCHEMA.",
    )
    parser.add_argument(
        "--addr", default="127.0.0.1:8000", help="HOST:PORT to listen on (port 0: any free one)"
    )
    args = parser.parse_args(argv)
    host, _, port = args.addr.rpartition(":")
    if not host or not port.isdigit():
        parser.error(f"--addr must be HOST:PORT, got {args.addr!r}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    serve(host, int(port))


if __name__ == "__main__":
    main()
