"""deploy/compose.yaml stays runnable: api and worker services, healthchecks, pinned images,
a Qdrant server matching the installed client, and no MEMSTREAM_* that settings ignore
(settings use extra="ignore", so a typo there would be silently dropped)."""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path
from typing import Any

import yaml

from memstream.infra.settings import Settings

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def compose() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    return doc


def memstream_vars() -> dict[str, str]:
    found: dict[str, str] = {}
    for name, svc in compose()["services"].items():
        for key in svc.get("environment") or {}:
            if key.startswith("MEMSTREAM_"):
                found[key] = f"service {name}"
    for line in (DEPLOY / "memstream.env").read_text().splitlines():
        key = line.split("=", 1)[0].strip()
        if key.startswith("MEMSTREAM_"):
            found[key] = "memstream.env"
    return found


def test_every_memstream_variable_is_a_setting() -> None:
    fields = set(Settings.model_fields)
    found = memstream_vars()
    assert "MEMSTREAM_KAFKA_BOOTSTRAP" in found  # the parse found the variables at all
    unknown = {
        k: where for k, where in found.items() if k.removeprefix("MEMSTREAM_").lower() not in fields
    }
    assert unknown == {}


def test_api_and_worker_run_memstream_with_healthchecks() -> None:
    services = compose()["services"]
    assert services["api"]["command"] == ["api"] and services["worker"]["command"] == ["worker"]
    assert "/healthz" in " ".join(services["api"]["healthcheck"]["test"])
    for name in ("kafka", "postgres", "redis", "qdrant", "clickhouse", "minio", "api"):
        assert "healthcheck" in services[name], name
    assert "mc mb" in " ".join(services["buckets"]["entrypoint"])
    assert services["worker"]["depends_on"]["buckets"] == {
        "condition": "service_completed_successfully"
    }


def test_images_are_pinned_and_qdrant_matches_the_client() -> None:
    services = compose()["services"]
    for name, svc in services.items():
        image = svc["image"]
        tag = image.rsplit(":", 1)[1] if ":" in image else ""
        assert tag and tag != "latest" and any(c.isdigit() for c in tag), f"{name}: {image}"
    server = services["qdrant"]["image"].rsplit(":v", 1)[1].split(".")[:2]
    client = version("qdrant-client").split(".")[:2]
    assert server == client, f"qdrant server {server} vs qdrant-client {client}"
