"""A loopback TCP relay that can stall: the link between a weight sender and its receivers,
with a fault switch. While stalled it moves no byte in either direction (and new connections
hang the same way), so kernel buffers fill and both ends see what a stuck network does to
them; `flow()` lets the held bytes through again."""

from __future__ import annotations

import socket
import threading


class StallRelay:
    def __init__(self, target_port: int, host: str = "127.0.0.1") -> None:
        self.target = (host, target_port)
        self.server = socket.create_server((host, 0))
        self.port = self.server.getsockname()[1]
        self.flowing = threading.Event()
        self.flowing.set()
        self.socks: list[socket.socket] = []
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def stall(self) -> None:
        self.flowing.clear()

    def flow(self) -> None:
        self.flowing.set()

    def _accept(self) -> None:
        while True:
            try:
                near, _ = self.server.accept()
            except OSError:
                return
            try:
                far = socket.create_connection(self.target, timeout=5.0)
            except OSError:
                near.close()
                continue
            far.settimeout(None)
            self.connections += 1
            self.socks += [near, far]
            threading.Thread(target=self._pump, args=(near, far), daemon=True).start()
            threading.Thread(target=self._pump, args=(far, near), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        while True:
            self.flowing.wait()
            try:
                data = src.recv(1 << 16)
            except OSError:
                break
            if not data:
                break
            self.flowing.wait()  # stalled with bytes in hand: hold them
            try:
                dst.sendall(data)
            except OSError:
                break
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self.flow()
        self.server.close()
        for s in self.socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
