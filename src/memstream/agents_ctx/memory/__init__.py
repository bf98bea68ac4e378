"""Agent memory: curated entries, the three memory tools and their policies.

Pure rules, one module each: ``screening`` (injection / sensitive data), ``policy``
(validation, scope, capacity, the store decision), ``ranking`` (recall boost and limits),
``decay`` (hygiene rules), ``pinning`` (the pinned set). I/O: ``store`` (the Postgres
repository and ``MemoryService``), ``hygiene`` (the daily pass), ``ports`` (the index port).
"""
