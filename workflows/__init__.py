"""Deterministic workflow code of xmc-resumption (no I/O).

Deterministic workflow code of xmc-resumption: the resumption loop, the throttle policy and the pydantic models shared
with activities and callers. No I/O here (Temporal's workflow sandbox).
"""
