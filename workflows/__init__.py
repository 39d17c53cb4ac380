"""Deterministic workflow code of xmc-resumption (no I/O: Temporal's workflow sandbox).

The resumption workflow and its loop, the throttle policy and the pydantic models shared with activities and callers.
"""
