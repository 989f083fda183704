"""Sans-IO. OAuth 2.0 access tokens (JWT): validation, the JWKS cache, claims to groups, renewal.

The parts a token connection needs, as pure functions and state machines (bytes, strings and
``now`` in, results out; no socket, clock or thread): :mod:`.validate` checks a token against
the keys of a JWKS and the configured issuer, audience, algorithms and clock skew;
:mod:`.jwks` holds the keys and says when to fetch them; :mod:`.claims` turns the claims into
the policy user and its QDR group per vhost; :mod:`.renewal` reads and answers the in-band
renewal requests (CBS ``put-token`` on ``$cbs``, RabbitMQ's ``PUT /auth/tokens``);
:mod:`.sasl` takes the token out of a SASL PLAIN or OAUTHBEARER initial response;
:mod:`.config` is the configuration model. Every refusal is a
:class:`~.errors.TokenRejected` with a reason from :class:`~.errors.RejectReason`
(docs/decisions/0008-token-authority.md).
"""
