"""Embedded servers launched from Python packages (or Maven jars) for `memstream up` and tests.

Each launcher derives from :class:`memstream.infra.embedded.base.EmbeddedServer`.
"""
