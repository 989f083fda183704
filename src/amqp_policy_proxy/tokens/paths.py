"""Sans-IO. Reading a claim by its path: ``scope``, ``realm_access.roles``, a URL-named claim.

A claim path is a claim name or names joined by dots, each naming a member of the object the
previous one named (Keycloak's ``realm_access.roles``, ``resource_access.CLIENT.roles``). A
claim name may itself hold dots (Auth0's ``https://example.com/roles``): at each level the
longest name that is present wins over a shorter one followed by a deeper path.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def claim_at(claims: Mapping[str, Any], path: str) -> Any:
    """The value at ``path`` in ``claims``, or None when absent.

    Args:
        claims: the token's claims (a JSON object).
        path: ``name`` or ``name.member.member`` (see the module text).

    Returns:
        The JSON value found (any type), or None.
    """
    if path in claims:
        return claims[path]
    # try the longest leading name first, so "a.b" as a member beats "a" then "b"
    cut = path.rfind(".")
    while cut > 0:
        head = path[:cut]
        inner = claims.get(head)
        if isinstance(inner, Mapping):
            found = claim_at(inner, path[cut + 1:])
            if found is not None:
                return found
        cut = path.rfind(".", 0, cut)
    return None


def claim_strings(value: Any) -> tuple[str, ...]:
    """The strings a claim value holds: a space-separated string's words (OAuth 2.0
    ``scope``, RFC 8693), or a list's string members (``roles``, ``groups``); anything else
    holds none.

    Returns:
        The strings in order, empty ones left out.
    """
    if isinstance(value, str):
        return tuple(value.split())
    if isinstance(value, list):
        return tuple(v for v in value if isinstance(v, str) and v)
    return ()
