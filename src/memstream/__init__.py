"""memstream: memory for LLM agents, built as an event-sourced stream-processing pipeline.

Subpackages, by what they own (see docs/architecture.md):

- ``schemas``     the vocabulary: events, records, topics, codec, the spec's numbers. Pure.
- ``infra``       adapters to real systems, settings, embedded launchers; ``infra.cli`` wires it all.
- ``streams``     stream processors (a batch runtime on aiokafka) and the relays.
- ``projections`` read models built from topics (ClickHouse messages, Qdrant memory index).
- ``agents_ctx``  what agents call: context assembly, memory and journal tools, HTTP/MCP surfaces.
"""

__version__ = "0.1.0"
