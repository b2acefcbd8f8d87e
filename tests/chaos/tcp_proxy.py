"""A loopback TCP proxy: ``python -m tests.chaos.tcp_proxy LISTEN_PORT TARGET_PORT``.

The chaos run puts it between its workers and producers and the shared RabbitMQ, which must
not be stopped: killing this process cuts every connection at once, starting it again on the
same port restores the way through.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys

HOST = "127.0.0.1"


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()


async def _serve(listen: int, target: int) -> None:
    async def handle(client_reader: asyncio.StreamReader, client: asyncio.StreamWriter) -> None:
        try:
            server_reader, server = await asyncio.open_connection(HOST, target)
        except OSError:
            client.close()
            return
        await asyncio.gather(_pipe(client_reader, server), _pipe(server_reader, client))

    server = await asyncio.start_server(handle, HOST, listen, reuse_address=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    listen, target = int(sys.argv[1]), int(sys.argv[2])
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(listen, target))


if __name__ == "__main__":
    main()
