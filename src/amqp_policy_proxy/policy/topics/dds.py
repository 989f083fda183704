"""DDS Security permissions documents as a topic authorization model (docs/dds-permissions.md).

A vhost's ``permissionsDocument`` is an OMG DDS Security 1.1 permissions document (section
9.4.1.3), S/MIME-signed by the permissions CA named by ``permissionsCa``.
:func:`load_permissions` verifies the signature, parses the XML and compiles it into an
immutable :class:`DdsPermissions`; :meth:`DdsPermissions.check` then decides one publish (a
sender link's target, an anonymous-relay message's ``to``) or subscribe (a receiver link's
source) as a :class:`DdsVerdict` value.

Evaluation, as in DDS Security 9.4.1.3.2:

* The grants for the client are those whose ``subject_name`` matches: the client's TLS
  certificate subject when there is one (distinguished names compared attribute by attribute,
  in any order), else the AMQP user name (equal to the whole ``subject_name``, or to its CN).
  No grant: denied. Of several grants, the first (in document order) whose validity window
  contains ``wall_now`` is used; when none does, the request is denied.
* Within the grant, ``allow_rule`` and ``deny_rule`` elements are tried in document order; the
  first whose ``publish`` (or ``subscribe``) criteria name a topic pattern matching the address
  decides. Patterns are ``fnmatch`` patterns (``fnmatch.fnmatchcase``: ``*``, ``?``, ``[seq]``,
  ``[!seq]``; ``/`` is an ordinary character). No rule applies: the grant's ``<default>``.
* ``<domains>`` is validated but does not restrict: the proxy has no DDS domain id, so every
  rule applies whatever its domain ids. ``<relay>`` criteria are validated and never apply (no
  AMQP activity corresponds). An AMQP link is in DDS's default partition (the empty string) and
  carries no data tags: a criteria with ``<partitions>`` applies only when one of its partition
  patterns matches the empty string (``*`` does), and ``<data_tags>`` never restrict.

Signature verification runs the ``openssl`` command line tool (``openssl smime -verify``)
through :mod:`subprocess` with a timeout. ``cryptography`` (the library we otherwise prefer)
can *create* PKCS#7/S-MIME signatures but has no public API to *verify* one (only a
non-public ``test_support.pkcs7_verify``), and DDS tools sign with ``openssl smime -sign``
anyway, so the same tool checks what it produced. Only ``permissionsCa`` is trusted: the
system trust store is switched off (``-no-CApath -no-CAstore``), the CA may be an intermediate
(``-partial_chain``) and no S/MIME key-usage purpose is required of the signer
(``-purpose any``), since DDS permissions CAs sign with their CA certificate.

XML is parsed with ``defusedxml`` (no DTDs, entities or external references). Loading does
file I/O and runs a process; :meth:`DdsPermissions.check` is pure and never reads the clock
(the caller passes ``wall_now``). The user guide is ``docs/dds-permissions.md``.
"""

from __future__ import annotations

import datetime as _dt
import fnmatch
import functools
import re
import shutil
import subprocess
import xml.etree.ElementTree as _ET
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

import defusedxml
import defusedxml.ElementTree as _DET
from cryptography import x509

__all__ = [
    "DdsError",
    "DdsGrant",
    "DdsPermissions",
    "DdsRule",
    "DdsVerdict",
    "format_time",
    "load_permissions",
    "parse_dn",
    "parse_permissions",
    "parse_time",
    "verify_signed",
]

ACTIVITIES = ("publish", "subscribe")
"""The activities :meth:`DdsPermissions.check` decides."""

MAX_DOCUMENT_BYTES = 16 * 1024 * 1024
"""A permissions document (signed file) larger than this is refused unread."""

OPENSSL_TIMEOUT = 20.0
"""Seconds ``openssl smime -verify`` may run before the load fails."""

NOT_SIGNED = "not signed"
"""Reason: the document is not an S/MIME signed message (plain XML, or another S/MIME type)."""
NOT_BY_CA = "signature does not verify against permissionsCa"
"""Reason: the signer's certificate does not chain to ``permissionsCa``."""
TAMPERED = "tampered"
"""Reason: the signed content or the signature was altered after signing."""


class DdsError(Exception):
    """A permissions document (or its CA) cannot be used; nothing of it is loaded.

    ``reason`` is precise and stable, for messages and tests: :data:`NOT_SIGNED`,
    :data:`NOT_BY_CA`, :data:`TAMPERED`, ``"XML: <element path>: <problem>"``,
    ``"XML: line L, column C: <parser message>"``, ``"grant 'x': not_after before
    not_before"``, ``"permissionsCa: ..."``, ``"cannot read ...: ..."``, ``"openssl: ..."``.
    ``detail`` adds what the underlying tool said (may be empty). ``str(exc)`` is
    ``"DOCUMENT: REASON (DETAIL)"`` with the empty parts left out.
    """

    reason: str
    detail: str
    document: str | None

    def __init__(self, reason: str, detail: str = "", document: str | None = None) -> None:
        """Build the error.

        Args:
            reason: the precise reason (see the class docstring).
            detail: supporting text, e.g. openssl's own error; empty when there is none.
            document: the permissions document's path as given, if known.
        """
        self.reason = reason
        self.detail = detail
        self.document = document
        super().__init__(self._render())

    def _render(self) -> str:
        text = f"{self.document}: {self.reason}" if self.document else self.reason
        return f"{text} ({self.detail})" if self.detail else text

    def with_document(self, document: str) -> DdsError:
        """Return a copy of this error naming ``document``."""
        return DdsError(self.reason, self.detail, document)


@dataclass(frozen=True, slots=True)
class DdsVerdict:
    """The decision for one publish or subscribe; a value, never an exception.

    ``decided_by`` names what decided, for ``explain`` and denial logs, e.g.
    ``"dds grant 'alice' allow_rule[1] publish topic 'sensors/*'"``,
    ``"dds grant 'alice' default DENY"``,
    ``"dds grant 'alice' outside validity (not_after 2026-01-01T00:00:00Z)"``,
    ``"dds: no grant for subject 'CN=x'"`` or ``"dds: no grant for user 'bob'"``.
    Rule indexes are 1-based among the grant's elements of that name, as in XPath.
    """

    allowed: bool
    decided_by: str


@dataclass(frozen=True, slots=True)
class DdsRule:
    """One ``allow_rule`` or ``deny_rule`` of a grant, reduced to what applies to AMQP.

    ``publish`` and ``subscribe`` hold the topic patterns of the rule's criteria that apply
    (criteria restricted to non-default partitions are left out; see the module docstring).
    """

    kind: str
    """``"allow_rule"`` or ``"deny_rule"``."""
    index: int
    """1-based position among the grant's elements named ``kind``."""
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]

    @property
    def allow(self) -> bool:
        """True for an ``allow_rule``."""
        return self.kind == "allow_rule"

    @property
    def label(self) -> str:
        """``kind[index]``, e.g. ``"deny_rule[2]"``."""
        return f"{self.kind}[{self.index}]"


@dataclass(frozen=True, slots=True)
class DdsGrant:
    """One ``<grant>``: subject, validity window (POSIX seconds, inclusive), rules, default."""

    name: str
    subject_name: str
    """As written in the document (surrounding white space removed)."""
    not_before: float
    not_after: float
    rules: tuple[DdsRule, ...]
    default_allow: bool
    _matchers: tuple[tuple[_Matcher, ...], tuple[_Matcher, ...]] = field(
        repr=False, compare=False, default=((), ())
    )
    _default: DdsVerdict | None = field(repr=False, compare=False, default=None)

    @property
    def validity_text(self) -> str:
        """The window as ``"NOT_BEFORE .. NOT_AFTER"`` in UTC (``...Z``)."""
        return f"{format_time(self.not_before)} .. {format_time(self.not_after)}"


@dataclass(frozen=True, slots=True)
class _Matcher:
    """One rule's patterns for one activity: ``regex`` is their alternation, ``entries`` each
    pattern compiled with the verdict it gives (built once, so a check allocates nothing)."""

    regex: re.Pattern[str]
    entries: tuple[tuple[re.Pattern[str], DdsVerdict], ...]


# --------------------------------------------------------------------------------------------
# Distinguished names (RFC 4514, leniently)

_TYPE_OIDS = {
    "cn": "2.5.4.3",
    "commonname": "2.5.4.3",
    "sn": "2.5.4.4",
    "surname": "2.5.4.4",
    "serialnumber": "2.5.4.5",
    "c": "2.5.4.6",
    "countryname": "2.5.4.6",
    "l": "2.5.4.7",
    "localityname": "2.5.4.7",
    "st": "2.5.4.8",
    "s": "2.5.4.8",
    "stateorprovincename": "2.5.4.8",
    "street": "2.5.4.9",
    "streetaddress": "2.5.4.9",
    "o": "2.5.4.10",
    "organizationname": "2.5.4.10",
    "ou": "2.5.4.11",
    "organizationalunitname": "2.5.4.11",
    "title": "2.5.4.12",
    "t": "2.5.4.12",
    "businesscategory": "2.5.4.15",
    "postalcode": "2.5.4.17",
    "name": "2.5.4.41",
    "givenname": "2.5.4.42",
    "gn": "2.5.4.42",
    "initials": "2.5.4.43",
    "generationqualifier": "2.5.4.44",
    "x500uniqueidentifier": "2.5.4.45",
    "dnqualifier": "2.5.4.46",
    "pseudonym": "2.5.4.65",
    "organizationidentifier": "2.5.4.97",
    "dc": "0.9.2342.19200300.100.1.25",
    "domaincomponent": "0.9.2342.19200300.100.1.25",
    "uid": "0.9.2342.19200300.100.1.1",
    "userid": "0.9.2342.19200300.100.1.1",
    "emailaddress": "1.2.840.113549.1.9.1",
    "email": "1.2.840.113549.1.9.1",
    "e": "1.2.840.113549.1.9.1",
}
_CN = "2.5.4.3"
_NAME_TYPE = re.compile(r"[A-Za-z][A-Za-z0-9-]*\Z")
_OID_TYPE = re.compile(r"(?:[Oo][Ii][Dd]\.)?([0-9]+(?:\.[0-9]+)+)\Z")
_HEX = "0123456789abcdefABCDEF"
_SPECIALS = ' "#+,;<=>\\'
_WHITESPACE = " \t\r\n"

DnKey = tuple[tuple[str, str], ...]
"""A distinguished name for comparison: sorted (attribute type OID or lower-case name, value)."""


def _attribute_type(text: str) -> str:
    t = text.strip()
    m = _OID_TYPE.match(t)
    if m:
        return m.group(1)
    if not _NAME_TYPE.match(t):
        raise ValueError(f"bad attribute type {t!r}")
    return _TYPE_OIDS.get(t.lower(), t.lower())


def _split_unescaped(text: str, seps: str) -> list[str]:
    """Split on unescaped, unquoted separator characters, keeping escapes for later."""
    parts: list[str] = []
    current: list[str] = []
    i, quoted = 0, False
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            if i + 1 >= len(text):
                raise ValueError("dangling '\\' at the end")
            current.append(text[i : i + 2])
            i += 2
            continue
        if ch == '"':
            quoted = not quoted
        elif ch in seps and not quoted:
            parts.append("".join(current))
            current = []
            i += 1
            continue
        current.append(ch)
        i += 1
    if quoted:
        raise ValueError("unterminated quoted value")
    parts.append("".join(current))
    return parts


def _strip_unescaped_spaces(raw: str, chars: str = " ") -> str:
    """Drop leading ``chars`` and trailing ones that are not escaped (``\\ `` is kept)."""
    text = raw.lstrip(chars)
    end = len(text)
    while end > 0 and text[end - 1] in chars:
        backslashes = 0
        while end - 2 - backslashes >= 0 and text[end - 2 - backslashes] == "\\":
            backslashes += 1
        if backslashes % 2:
            break
        end -= 1
    return text[:end]


def _unescape_value(raw: str) -> str:
    """RFC 4514 section 3 value: ``\\X`` specials, ``\\HH`` UTF-8 bytes, quotes, ``#hex``."""
    text = _strip_unescaped_spaces(raw)
    if text.startswith("#"):
        return text.lower()  # BER-encoded value: compared as its hex text
    if len(text) >= 2 and text.startswith('"') and text.endswith('"'):
        text = text[1:-1]  # RFC 2253/1779 quoted value; escapes inside still apply
    out = bytearray()
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            nxt = text[i + 1 : i + 2]
            if nxt and nxt in _HEX and text[i + 2 : i + 3] and text[i + 2] in _HEX:
                out.append(int(text[i + 1 : i + 3], 16))
                i += 3
                continue
            if nxt and nxt in _SPECIALS:
                out += nxt.encode()
                i += 2
                continue
            raise ValueError(f"bad escape '\\{nxt}'")
        out += ch.encode()
        i += 1
    try:
        return out.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError("escaped bytes are not UTF-8") from exc


def parse_dn(text: str) -> DnKey:
    """Parse a distinguished name into its comparison key.

    Accepted: RFC 4514 (``CN=alice,O=Example\\, Inc.,C=NL``, as
    ``cryptography``'s ``Name.rfc4514_string()`` writes it), leniently: spaces around ``,``,
    ``+``, ``=`` are ignored (RFC 2253 and many DDS documents write ``C=NL, O=x, CN=y``),
    ``;`` separates like ``,``, quoted values are unquoted, and the OpenSSL one-line form
    (``/C=NL/O=x/CN=y``) is read too. Attribute types are case-insensitive, and names and
    OIDs are interchangeable (``CN``, ``cn``, ``commonName``, ``2.5.4.3`` and
    ``OID.2.5.4.3`` are one type; ``E`` and ``emailAddress`` are 1.2.840.113549.1.9.1, which
    ``rfc4514_string()`` prints as an OID). Values are compared exactly after unescaping
    (``\\,``, ``\\2C``, UTF-8 ``\\HH`` sequences); ``#hex`` values are kept as lower-case text.

    Args:
        text: the distinguished name.

    Returns:
        A sorted tuple of (type, value) pairs: two names are the same when their keys are
        equal, whatever the order of their attributes (multi-valued RDNs are flattened).

    Raises:
        ValueError: the text is not a distinguished name (message says why).
    """
    s = _strip_unescaped_spaces(text, _WHITESPACE)
    if not s:
        raise ValueError("empty distinguished name")
    if s.startswith("/"):
        avas = [a for rdn in _split_unescaped(s[1:], "/") for a in _split_unescaped(rdn, "+")]
    else:
        avas = [a for rdn in _split_unescaped(s, ",;") for a in _split_unescaped(rdn, "+")]
    pairs = []
    for ava in avas:
        if not ava.strip():
            raise ValueError("empty attribute (doubled or trailing separator)")
        type_text, sep, value_text = ava.partition("=")
        if not sep:
            raise ValueError(f"attribute {ava.strip()!r} has no '='")
        pairs.append((_attribute_type(type_text), _unescape_value(value_text)))
    return tuple(sorted(pairs))


@functools.lru_cache(maxsize=4096)
def _subject_key(subject: str) -> DnKey | None:
    try:
        return parse_dn(subject)
    except ValueError:
        return None


# --------------------------------------------------------------------------------------------
# xs:dateTime

_DATETIME = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(\.\d+)?(Z|[+-]\d{2}:\d{2})?\Z"
)


def parse_time(text: str) -> float:
    """Parse an ``xs:dateTime`` (``CCYY-MM-DDThh:mm:ss[.fff][Z|(+|-)hh:mm]``).

    DDS Security 9.4.1.3.2.2: a time without a zone is UTC. ``24:00:00`` is the next day's
    midnight, as in XML Schema.

    Returns:
        POSIX seconds.

    Raises:
        ValueError: not an ``xs:dateTime`` or not a real date.
    """
    m = _DATETIME.match(text.strip())
    if not m:
        raise ValueError(f"not an xs:dateTime (CCYY-MM-DDThh:mm:ss[Z|+hh:mm]): {text.strip()!r}")
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    fraction, zone = m.group(7), m.group(8)
    extra = 0.0
    if hour == 24 and minute == 0 and second == 0 and not (fraction and int(fraction[1:])):
        hour, extra = 0, 86400.0
    tz = _dt.UTC
    if zone and zone != "Z":
        sign = 1 if zone[0] == "+" else -1
        zh, zm = int(zone[1:3]), int(zone[4:6])
        if zh > 14 or zm > 59:
            raise ValueError(f"bad time zone {zone!r}")
        tz = _dt.timezone(sign * _dt.timedelta(hours=zh, minutes=zm))
    try:
        moment = _dt.datetime(year, month, day, hour, minute, second, tzinfo=tz)
    except ValueError as exc:
        raise ValueError(f"not a valid date and time: {text.strip()!r} ({exc})") from exc
    return moment.timestamp() + extra + (float(fraction) if fraction else 0.0)


def format_time(seconds: float) -> str:
    """Render POSIX seconds as ``CCYY-MM-DDThh:mm:ss[.ffffff]Z`` (UTC)."""
    moment = _dt.datetime.fromtimestamp(seconds, _dt.UTC)
    text = moment.strftime("%Y-%m-%dT%H:%M:%S")
    if moment.microsecond:
        text += f".{moment.microsecond:06d}".rstrip("0")
    return text + "Z"


# --------------------------------------------------------------------------------------------
# XML

_REPEATABLE = {
    "grant", "allow_rule", "deny_rule", "publish", "subscribe", "relay", "topic",
    "partition", "tag", "id", "id_range",
}


def _local(tag: object) -> str:
    """Element name without namespace (documents may carry a default namespace)."""
    return tag.rsplit("}", 1)[-1] if isinstance(tag, str) else ""


class _Node:
    """An element with its path, for precise errors."""

    __slots__ = ("element", "name", "path")

    def __init__(self, element: _ET.Element, path: str) -> None:
        self.element = element
        self.name = _local(element.tag)
        self.path = path

    def fail(self, problem: str) -> DdsError:
        return DdsError(f"XML: {self.path}: {problem}")

    def children(self, allowed: Iterable[str]) -> list[_Node]:
        allowed = tuple(allowed)
        counts: dict[str, int] = {}
        out = []
        for child in self.element:
            if not isinstance(child.tag, str):
                continue  # comments, processing instructions
            name = _local(child.tag)
            counts[name] = counts.get(name, 0) + 1
            step = f"{name}[{counts[name]}]" if name in _REPEATABLE else name
            node = _Node(child, f"{self.path}/{step}")
            if name not in allowed:
                expected = ", ".join(f"<{a}>" for a in allowed) or "no elements"
                raise node.fail(f"unexpected element <{name}> (expected {expected})")
            out.append(node)
        return out

    def maybe(self, children: list[_Node], name: str) -> _Node | None:
        found = [c for c in children if c.name == name]
        if len(found) > 1:
            raise found[1].fail(f"<{name}> may appear only once in <{self.name}>")
        return found[0] if found else None

    def one(self, children: list[_Node], name: str) -> _Node:
        found = self.maybe(children, name)
        if found is None:
            raise self.fail(f"missing <{name}>")
        return found

    def text(self, *, allow_empty: bool = False) -> str:
        """The element's text without surrounding white space (an escaped ``\\ `` at the end
        of a distinguished name is kept); elements inside, or no text, are errors."""
        if len(self.element):
            raise self.fail(f"<{self.name}> must contain text, not elements")
        value = _strip_unescaped_spaces(self.element.text or "", _WHITESPACE)
        if not value and not allow_empty:
            raise self.fail(f"<{self.name}> is empty")
        return value


def _domain_id(node: _Node) -> int:
    value = node.text()
    if not (value.isascii() and value.isdigit()):
        raise node.fail(f"domain id must be a non-negative integer, got {value!r}")
    return int(value)


def _check_domains(node: _Node) -> None:
    members = node.children(("id", "id_range"))
    if not members:
        raise node.fail("<domains> needs at least one <id> or <id_range>")
    for member in members:
        if member.name == "id":
            _domain_id(member)
            continue
        bounds = member.children(("min", "max"))
        low = member.maybe(bounds, "min")
        high = member.maybe(bounds, "max")
        if low is None and high is None:
            raise member.fail("<id_range> needs <min>, <max> or both")
        if low is not None and high is not None and _domain_id(low) > _domain_id(high):
            raise member.fail("<min> is greater than <max>")
        for bound in (low, high):
            if bound is not None:
                _domain_id(bound)


def _criteria_topics(node: _Node) -> tuple[str, ...]:
    """Topic patterns of one ``<publish>``/``<subscribe>``/``<relay>``; () when the criteria
    cannot apply to an AMQP link (partitions that exclude the default partition)."""
    parts = node.children(("topics", "partitions", "data_tags"))
    topics_node = node.one(parts, "topics")
    topics = tuple(t.text() for t in topics_node.children(("topic",)))
    if not topics:
        raise topics_node.fail("<topics> needs at least one <topic>")
    partitions_node = node.maybe(parts, "partitions")
    applies = True
    if partitions_node is not None:
        # an empty <partition/> names the default partition
        patterns = [p.text(allow_empty=True) for p in partitions_node.children(("partition",))]
        if not patterns:
            raise partitions_node.fail("<partitions> needs at least one <partition>")
        applies = any(fnmatch.fnmatchcase("", p) for p in patterns)
    tags_node = node.maybe(parts, "data_tags")
    if tags_node is not None:
        for tag in tags_node.children(("tag",)):
            fields = tag.children(("name", "value"))
            tag.one(fields, "name").text()
            tag.one(fields, "value")  # may be empty
    return topics if applies else ()


def _parse_rule(node: _Node, index: int) -> DdsRule:
    parts = node.children(("domains", "publish", "subscribe", "relay"))
    _check_domains(node.one(parts, "domains"))
    publish: list[str] = []
    subscribe: list[str] = []
    for part in parts:
        if part.name == "publish":
            publish += _criteria_topics(part)
        elif part.name == "subscribe":
            subscribe += _criteria_topics(part)
        elif part.name == "relay":
            _criteria_topics(part)
    return DdsRule(node.name, index, tuple(publish), tuple(subscribe))


def _matcher(allow: bool, prefix: str, patterns: tuple[str, ...]) -> _Matcher:
    """Compile one rule's fnmatch patterns for one activity; ``prefix`` starts the verdicts'
    ``decided_by`` (``"dds grant 'NAME' RULE[i] ACTIVITY topic"``)."""
    entries = tuple(
        (re.compile(fnmatch.translate(p)), DdsVerdict(allow, f"{prefix} '{p}'"))
        for p in dict.fromkeys(patterns)
    )
    combined = re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in patterns))
    return _Matcher(combined, entries)


def _parse_grant(node: _Node) -> DdsGrant:
    name = (node.element.get("name") or "").strip()
    if not name:
        raise node.fail("<grant> needs a non-empty name attribute")
    parts = node.children(("subject_name", "validity", "allow_rule", "deny_rule", "default"))
    subject_node = node.one(parts, "subject_name")
    validity = node.one(parts, "validity")
    default_node = node.one(parts, "default")
    subject = subject_node.text()
    if "=" in subject:
        try:
            parse_dn(subject)
        except ValueError as exc:
            raise subject_node.fail(f"not a distinguished name: {exc}") from None
    window = validity.children(("not_before", "not_after"))
    bounds = []
    for bound_name in ("not_before", "not_after"):
        bound = validity.one(window, bound_name)
        try:
            bounds.append(parse_time(bound.text()))
        except ValueError as exc:
            raise bound.fail(str(exc)) from None
    not_before, not_after = bounds
    if not_after < not_before:
        raise DdsError(f"grant '{name}': not_after before not_before")
    default_text = default_node.text()
    if default_text not in ("ALLOW", "DENY"):
        raise default_node.fail(f"expected ALLOW or DENY, got {default_text!r}")
    default_allow = default_text == "ALLOW"
    counts = {"allow_rule": 0, "deny_rule": 0}
    rules = []
    for part in parts:
        if part.name in counts:
            counts[part.name] += 1
            rules.append(_parse_rule(part, counts[part.name]))
    matchers: list[tuple[_Matcher, ...]] = []
    for activity in ACTIVITIES:
        per_activity = []
        for rule in rules:
            patterns = getattr(rule, activity)
            if patterns:
                prefix = f"dds grant '{name}' {rule.label} {activity} topic"
                per_activity.append(_matcher(rule.allow, prefix, patterns))
        matchers.append(tuple(per_activity))
    default = DdsVerdict(default_allow, f"dds grant '{name}' default {default_text}")
    return DdsGrant(
        name=name,
        subject_name=subject,
        not_before=not_before,
        not_after=not_after,
        rules=tuple(rules),
        default_allow=default_allow,
        _matchers=(matchers[0], matchers[1]),
        _default=default,
    )


def parse_permissions(document: bytes | str) -> DdsPermissions:
    """Parse and compile the XML of a permissions document (already verified or unsigned).

    Sans-IO; :func:`load_permissions` is the entry point for files, which also checks the
    signature. The structure is DDS Security 1.1's ``omg_shared_ca_permissions.xsd``:
    ``dds/permissions/grant+``; a grant has a ``name`` attribute, one ``subject_name``, one
    ``validity`` (``not_before``, ``not_after``), ``allow_rule``/``deny_rule`` elements (each
    with ``domains`` and any ``publish``, ``subscribe``, ``relay`` criteria of ``topics``,
    optional ``partitions`` and ``data_tags``) and one ``default`` (``ALLOW`` or ``DENY``).
    Element namespaces are ignored; the order of ``subject_name``, ``validity`` and
    ``default`` is not enforced (the order of rules is kept: it decides); a grant without rules
    is accepted (its default decides).

    Args:
        document: the XML, as bytes (encoding from the XML declaration) or text.

    Returns:
        The compiled permissions.

    Raises:
        DdsError: malformed XML (``"XML: line L, column C: ..."``), a DTD or entity
            (``"XML: ..."``), a structural or value error (``"XML: <path>: ..."``, e.g.
            ``XML: dds/permissions/grant[2]/default: expected ALLOW or DENY, got 'MAYBE'``),
            or ``"grant 'x': not_after before not_before"``.
    """
    try:
        root = _DET.fromstring(document, forbid_dtd=True)
    except _ET.ParseError as exc:
        line, column = exc.position  # expat: column counts from 0
        message = str(exc).split(":", 1)[0]
        raise DdsError(f"XML: line {line}, column {column + 1}: {message}") from None
    except defusedxml.DefusedXmlException as exc:
        raise DdsError(f"XML: forbidden construct: {exc}") from None
    top = _Node(root, _local(root.tag))
    if top.name != "dds":
        raise top.fail("the root element must be <dds>")
    permissions = top.one(top.children(("permissions",)), "permissions")
    grants = [_parse_grant(g) for g in permissions.children(("grant",))]
    if not grants:
        raise permissions.fail("<permissions> needs at least one <grant>")
    return DdsPermissions(grants)


# --------------------------------------------------------------------------------------------
# The compiled document


class DdsPermissions:
    """A compiled permissions document: immutable after construction, safe to share between
    threads; :meth:`check` is the per-link and per-message decision.

    Build it with :func:`load_permissions` (signed file) or :func:`parse_permissions` (XML).
    Grants are pre-indexed by normalised distinguished name and by user name, and topic
    patterns are precompiled, so a check is two dictionary look-ups and a few regex matches.
    """

    __slots__ = ("_by_dn", "_by_user", "grants", "source")

    grants: tuple[DdsGrant, ...]
    """Every grant, in document order."""
    source: str | None
    """The permissions document's path as given to :func:`load_permissions`, else None."""

    def __init__(self, grants: Iterable[DdsGrant], source: str | None = None) -> None:
        """Index the grants.

        Args:
            grants: compiled grants in document order (from :func:`parse_permissions`).
            source: the document's path, for messages.
        """
        self.grants = tuple(grants)
        self.source = source
        by_dn: dict[DnKey, list[DdsGrant]] = {}
        by_user: dict[str, list[DdsGrant]] = {}
        for grant in self.grants:
            users = [grant.subject_name]
            if "=" in grant.subject_name:
                key = parse_dn(grant.subject_name)
                by_dn.setdefault(key, []).append(grant)
                users += [value for type_, value in key if type_ == _CN]
            for user in dict.fromkeys(users):
                by_user.setdefault(user, []).append(grant)
        self._by_dn: Mapping[DnKey, tuple[DdsGrant, ...]] = MappingProxyType(
            {k: tuple(v) for k, v in by_dn.items()}
        )
        self._by_user: Mapping[str, tuple[DdsGrant, ...]] = MappingProxyType(
            {k: tuple(v) for k, v in by_user.items()}
        )

    def grants_for(self, subject: str | None, user: str) -> tuple[DdsGrant, ...]:
        """The grants naming this client, in document order (see :meth:`check`)."""
        if subject is not None:
            key = _subject_key(subject)
            return self._by_dn.get(key, ()) if key is not None else ()
        return self._by_user.get(user, ())

    def check(
        self, subject: str | None, user: str, activity: str, topic: str, wall_now: float
    ) -> DdsVerdict:
        """Decide whether the client may publish to, or subscribe from, ``topic``.

        Args:
            subject: the client's TLS certificate subject as an RFC 4514 string (from
                ``cryptography``'s ``Name.rfc4514_string()``) when TLS client
                authentication is on, else None. With a subject, grants match by
                distinguished name only (see :func:`parse_dn`); without one, by user name.
            user: the authenticated AMQP user name; a grant matches it when its
                ``subject_name`` equals the user name or its CN attribute does.
            activity: ``"publish"`` (sender target, anonymous-relay ``to``) or
                ``"subscribe"`` (receiver source).
            topic: the AMQP address, matched whole against the rules' fnmatch patterns.
            wall_now: the wall-clock time, POSIX seconds (validity windows are wall-clock).

        Returns:
            The verdict: no grant → denied; no grant valid at ``wall_now`` → denied; else the
            first rule (document order) with a matching pattern for the activity, else the
            grant's default.

        Raises:
            ValueError: ``activity`` is neither ``"publish"`` nor ``"subscribe"``.
        """
        if activity == "publish":
            slot = 0
        elif activity == "subscribe":
            slot = 1
        else:
            raise ValueError(f"activity must be 'publish' or 'subscribe', not {activity!r}")
        candidates = self.grants_for(subject, user)
        if not candidates:
            if subject is not None:
                return DdsVerdict(False, f"dds: no grant for subject '{subject}'")
            return DdsVerdict(False, f"dds: no grant for user '{user}'")
        for grant in candidates:
            if grant.not_before <= wall_now <= grant.not_after:
                break
        else:
            grant = candidates[0]
            if wall_now < grant.not_before:
                bound = f"not_before {format_time(grant.not_before)}"
            else:
                bound = f"not_after {format_time(grant.not_after)}"
            return DdsVerdict(False, f"dds grant '{grant.name}' outside validity ({bound})")
        for matcher in grant._matchers[slot]:
            if matcher.regex.match(topic):
                entries = matcher.entries
                if len(entries) == 1:
                    return entries[0][1]
                return next(verdict for rx, verdict in entries if rx.match(topic))
        assert grant._default is not None
        return grant._default

    def __repr__(self) -> str:
        """Short description: source and grant names."""
        names = ", ".join(g.name for g in self.grants)
        return f"DdsPermissions(source={self.source!r}, grants=[{names}])"


# --------------------------------------------------------------------------------------------
# Signature and files

_SMIME_TYPES = (b"multipart/signed", b"application/pkcs7-mime", b"application/x-pkcs7-mime")


def _looks_like_smime(data: bytes) -> bool:
    """True when the MIME header block names a signed (or opaque PKCS#7) S/MIME type."""
    head = re.split(rb"\r?\n\r?\n", data, maxsplit=1)[0].lower()
    return b"content-type:" in head and any(t in head for t in _SMIME_TYPES)


def _openssl_errors(stderr: str) -> list[str]:
    """openssl 3 error lines ``hex:error:code:lib:func:reason:file:line:data`` → reasons."""
    out = []
    for line in stderr.splitlines():
        parts = line.split(":", 8)
        if len(parts) >= 6 and parts[1] == "error":
            reason = parts[5]
            data = parts[8].strip() if len(parts) > 8 else ""
            out.append(f"{reason}: {data}" if data else reason)
    return out or [line.strip() for line in stderr.splitlines() if line.strip()][-1:]


def _strip_mime_header(content: bytes) -> bytes:
    """Remove the ``Content-Type: text/plain`` header ``openssl smime -sign -text`` adds."""
    if re.match(rb"(?i)content-type:", content):
        parts = re.split(rb"\r?\n\r?\n", content, maxsplit=1)
        return parts[1] if len(parts) == 2 else b""
    return content


def verify_signed(document: bytes, ca: Path, *, timeout: float = OPENSSL_TIMEOUT) -> bytes:
    """Verify an S/MIME signed document against the permissions CA; return the signed content.

    Runs ``openssl smime -verify -CAfile CA -no-CApath -no-CAstore -partial_chain -purpose
    any`` (only ``ca`` is trusted). Both detached (``multipart/signed``, what ``openssl smime
    -sign`` writes by default) and opaque (``-nodetach``) signatures are accepted, with or
    without ``-text`` at signing (its ``Content-Type: text/plain`` header is removed).

    Args:
        document: the signed file's bytes.
        ca: the permissions CA certificate file (PEM; each certificate in it is trusted).
        timeout: seconds before openssl is stopped.

    Returns:
        The signed content (the permissions XML).

    Raises:
        DdsError: :data:`NOT_SIGNED` (not an S/MIME signed message), :data:`NOT_BY_CA`
            (the signer does not chain to ``ca``, or its certificate is expired),
            :data:`TAMPERED` (content or signature altered; an unreadable signature block),
            ``"openssl: ..."`` (tool missing or timed out).
    """
    if not _looks_like_smime(document):
        stripped = document.lstrip(b"\xef\xbb\xbf \t\r\n")
        what = "plain XML" if stripped.startswith(b"<") else "no S/MIME signed-message header"
        raise DdsError(NOT_SIGNED, f"{what}; sign it with 'openssl smime -sign'")
    openssl = shutil.which("openssl")
    if openssl is None:
        raise DdsError("openssl: command not found (needed to verify the signature)")
    command = [
        openssl, "smime", "-verify", "-CAfile", str(ca), "-no-CApath", "-no-CAstore",
        "-partial_chain", "-purpose", "any",
    ]
    try:
        done = subprocess.run(
            command, input=document, capture_output=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        raise DdsError(f"openssl: no answer within {timeout:g} s") from None
    except OSError as exc:
        raise DdsError(f"openssl: cannot run: {exc}") from None
    if done.returncode == 0:
        return _strip_mime_header(done.stdout)
    stderr = done.stderr.decode("utf-8", "replace")
    errors = _openssl_errors(stderr)
    detail = "; ".join(errors)
    joined = stderr.lower()
    if "digest failure" in joined or "signature failure" in joined:
        raise DdsError(TAMPERED, f"openssl: {detail}")
    if "certificate verify error" in joined or "signer certificate not found" in joined:
        verify = [e.split("Verify error:", 1)[1].strip() for e in errors if "Verify error:" in e]
        raise DdsError(NOT_BY_CA, f"openssl: {'; '.join(verify) or detail}")
    if "wrong content type" in joined:
        raise DdsError(NOT_SIGNED, f"S/MIME but not signed data (openssl: {detail})")
    if "cafile" in joined or "x509_load_cert" in joined or "no certificate" in joined:
        raise DdsError("permissionsCa: openssl cannot use it", f"openssl: {detail}")
    raise DdsError(TAMPERED, f"the S/MIME structure is unreadable (openssl: {detail})")


def _check_ca(ca: Path) -> None:
    try:
        data = ca.read_bytes()
    except OSError as exc:
        raise DdsError(f"cannot read permissionsCa: {exc.strerror or exc}") from None
    try:
        x509.load_pem_x509_certificates(data)
    except ValueError as exc:
        raise DdsError("permissionsCa: not a PEM certificate file", str(exc)) from None


def load_permissions(document: Path, ca: Path) -> DdsPermissions:
    """Read a signed permissions document, verify it against the permissions CA, compile it.

    This is the vhost's ``permissionsDocument`` / ``permissionsCa`` pair (docs/dds-permissions.md).
    The file is read once; its signature is verified (:func:`verify_signed`) before any of its
    content is parsed (:func:`parse_permissions`). Runs in the loader (it does file I/O and
    starts ``openssl``), never per connection.

    Args:
        document: the S/MIME signed permissions document (``.p7s``).
        ca: the permissions CA certificate (PEM).

    Returns:
        The compiled permissions; ``source`` is ``str(document)``.

    Raises:
        DdsError: the document or CA cannot be read, the signature is missing, wrong or
            broken, or the XML is invalid; ``reason`` says which, ``document`` names the file.
    """
    name = str(document)
    try:
        _check_ca(ca)
        try:
            size = document.stat().st_size
            if size > MAX_DOCUMENT_BYTES:
                raise DdsError(f"document larger than {MAX_DOCUMENT_BYTES} bytes ({size})")
            data = document.read_bytes()
        except OSError as exc:
            raise DdsError(f"cannot read permissionsDocument: {exc.strerror or exc}") from None
        content = verify_signed(data, ca)
        parsed = parse_permissions(content)
    except DdsError as exc:
        raise exc.with_document(name) from None
    return DdsPermissions(parsed.grants, source=name)
