"""Deterministic workflow code of xmc-resumption (no I/O): what each module holds, docs/development.md, "Layout"."""
