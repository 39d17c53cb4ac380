"""All Redis logic of xmc-resumption; nothing here imports Temporal.

Modules: ``keys`` (key layout), ``results`` (pydantic result models, importable from workflow
code because they import no Redis), ``scripts`` (the Lua scripts), ``backlog`` (backlog
measurement), ``fencing`` (claims, leases and fencing tokens), ``held`` (pause state and the
pause-aware enqueue), ``publish`` (the atomic move of held tasks into the task stream),
``connection`` (dropping pooled connections after a failover).
"""
