"""The HTTP surface (FastAPI): ``create_app(services)`` and one router module per area."""
