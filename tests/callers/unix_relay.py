#!/usr/bin/env python3
"""A TCP -> unix socket byte relay, so HTTP tools without unix-socket support (schemathesis)
can reach the agent's local API. Usage: unix_relay.py SOCKET HOST PORT"""

import asyncio
import sys

SOCK, HOST, PORT = sys.argv[1], sys.argv[2], int(sys.argv[3])


async def pipe(r, w):
    try:
        while data := await r.read(65536):
            w.write(data)
            await w.drain()
    finally:
        w.close()


async def handle(cr, cw):
    try:
        ur, uw = await asyncio.open_unix_connection(SOCK)
    except OSError:
        cw.close()
        return
    await asyncio.gather(pipe(cr, uw), pipe(ur, cw), return_exceptions=True)


async def main():
    server = await asyncio.start_server(handle, HOST, PORT)
    async with server:
        await server.serve_forever()


asyncio.run(main())
