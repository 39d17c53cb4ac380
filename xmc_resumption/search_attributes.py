"""Client side of the fleet view (``workflows/fleet.py``): check and register the custom search attributes.

On a namespace, through Temporal's operator service.

The demo's and the tests' dev servers register them with ``--search-attribute NAME=TYPE`` (``dev_server_args``); on a
real cluster an operator runs ``register_commands`` once. The worker checks at start (``require``) and refuses to run
without them (``missing``): a workflow task that upserts an attribute the namespace does not know fails, and retries
for ever. Registering needs
the operator API (a dev server, the time-skipping test server, a self-hosted cluster's admin);
Temporal Cloud registers them with ``tcld`` instead.
"""

from __future__ import annotations

from typing import Any

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest, ListSearchAttributesRequest
from temporalio.client import Client
from temporalio.common import SearchAttributeIndexedValueType, SearchAttributeKey
from temporalio.service import RPCError, RPCStatusCode

from xmc_resumption.workflows import fleet

_CLI_TYPE = {
    SearchAttributeIndexedValueType.KEYWORD: "Keyword",
    SearchAttributeIndexedValueType.INT: "Int",
}


def dev_server_args() -> list[str]:
    """``temporal server start-dev`` flags that register ``fleet.ALL``: ``--search-attribute NAME=TYPE``."""
    args: list[str] = []
    for key in fleet.ALL:
        args += ["--search-attribute", f"{key.name}={_CLI_TYPE[key.indexed_value_type]}"]
    return args


def register_commands(namespace: str = "default") -> list[str]:
    """The ``temporal operator search-attribute create`` lines that register ``fleet.ALL`` on ``namespace``.

    One line per attribute, for a real cluster (Temporal Cloud: ``tcld namespace search-attributes add`` with the same
    names and types).
    """
    return [
        f"temporal operator search-attribute create --namespace {namespace} "
        f"--name {key.name} --type {_CLI_TYPE[key.indexed_value_type]}"
        for key in fleet.ALL
    ]


def missing(registered: dict[str, SearchAttributeIndexedValueType | int]) -> list[SearchAttributeKey[Any]]:
    """The keys of ``fleet.ALL`` that ``registered`` lacks or holds with another type.

    ``registered``: name -> type, as the operator service lists a namespace's custom search attributes.
    """
    return [key for key in fleet.ALL if int(registered.get(key.name, -1)) != int(key.indexed_value_type)]


class SearchAttributesMissingError(Exception):
    """The namespace lacks some of the fleet view's search attributes.

    The message is one line naming them and the command that registers them.
    """


async def missing_on(client: Client) -> list[str]:
    """Names of ``fleet.ALL`` that the client's namespace lacks (or holds with another type)."""
    listed = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=client.namespace)
    )
    return [key.name for key in missing(dict(listed.custom_attributes))]


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
            line for line in register_commands(client.namespace) if any(f"--name {n} " in line for n in names)
        )
        raise SearchAttributesMissingError(
            f"namespace {client.namespace} lacks the search attributes {', '.join(names)}: register them once with: "
            f"{commands}"
        )
