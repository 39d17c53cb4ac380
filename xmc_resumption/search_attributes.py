"""Client side of the fleet view (``workflows/fleet.py``): check and register the custom search attributes.

On a namespace, through Temporal's operator service.

The worker checks at start (``require``) and refuses to run without them: a workflow task that
upserts an attribute the namespace does not know fails, and retries for ever. Registering needs
the operator API (a dev server, the time-skipping test server, a self-hosted cluster's admin);
Temporal Cloud registers them with ``tcld`` instead.
"""

from __future__ import annotations

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest, ListSearchAttributesRequest
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from xmc_resumption.workflows import fleet


class SearchAttributesMissingError(Exception):
    """The namespace lacks some of the fleet view's search attributes.

    The message is one line naming them and the command that registers them.
    """


async def missing_on(client: Client) -> list[str]:
    """Names of ``fleet.ALL`` that the client's namespace lacks (or holds with another type)."""
    listed = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=client.namespace)
    )
    return [key.name for key in fleet.missing(dict(listed.custom_attributes))]


async def register(client: Client) -> None:
    """Register ``fleet.ALL`` on the client's namespace (idempotent: registers only those missing).

    Raises:
        temporalio.service.RPCError: the server refused (no operator permission, a type clash).
    """
    try:
        names = set(await missing_on(client))
    except RPCError as err:
        if err.status is not RPCStatusCode.UNIMPLEMENTED:
            raise
        names = {key.name for key in fleet.ALL}  # the time-skipping test server cannot list them
    if names:
        await client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(
                namespace=client.namespace,
                search_attributes={
                    k.name: IndexedValueType.ValueType(k.indexed_value_type) for k in fleet.ALL if k.name in names
                },
            )
        )


async def require(client: Client) -> None:
    """Raise ``SearchAttributesMissingError`` unless every attribute of ``fleet.ALL`` is registered."""
    names = await missing_on(client)
    if names:
        commands = " && ".join(
            line for line in fleet.register_commands(client.namespace) if any(f"--name {n} " in line for n in names)
        )
        raise SearchAttributesMissingError(
            f"namespace {client.namespace} lacks the search attributes {', '.join(names)}: register them once with: "
            f"{commands}"
        )
