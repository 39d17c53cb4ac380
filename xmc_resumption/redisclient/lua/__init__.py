"""The Lua scripts of the Redis layer (data files, loaded by ``redisclient.scripts``)."""
