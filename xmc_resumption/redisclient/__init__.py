"""All Redis logic of xmc-resumption; nothing here imports Temporal.

Modules: ``keys`` (key layout and the name rule), ``readings`` (what the replay reads: backlog, idle
consumers, memory) and ``results`` (the replies of the scripts that write), pydantic models importable
from workflow code because they import no Redis, ``scripts`` (loading and running the Lua scripts
of ``lua/``), ``connection`` (the client, and dropping pooled connections after a failover),
``errors`` (the errors it raises), ``backlog`` (backlog measurement), ``watch`` (the bounded drain polls of
one worker, sharing one reading per measurement),
``fencing`` (claims, leases and fencing tokens), ``held`` (pause state and the pause-aware
enqueue), ``publish`` (the atomic move of held tasks into the task stream), ``deadletter`` (held
tasks set aside, retried or dropped), ``memory`` (Redis's memory limit and eviction policy),
``weights`` (fair-share weights of a stream's replays), ``ratecap`` (the stream-wide rate cap),
``consumers`` (idle consumers holding pending entries), ``acl`` (the ACL user and its denials),
``text`` (one-line messages).
"""
