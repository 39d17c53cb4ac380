"""Operator and demo tooling of xmc-resumption: settings, local services, the ``xmc`` CLI, the demo."""
