"""Sans-IO. Topic authorization for AMQP addresses (docs/topic-authorization.md).

Publish is a client sender's target address and each anonymous-relay message's ``to``;
subscribe is a client receiver's source address. Besides QDR's address rules, a request must
pass every topic model configured for the connection's vhost and group:

* the vhost's ``topicTree``: ``anyAncestor`` (IBM MQ: any node from the address up to the root
  grants) or ``nearestAcl`` (WebSphere Message Broker: per authority, the nearest node defining
  it decides; wildcard subscriptions are checked per delivery; ``persistent`` decides whether
  durable messages stay durable), see :mod:`.tree`;
* the group's ordered ``permissions`` list with ``defaultBehaviour`` (HiveMQ), see
  :mod:`.permissions`;
* the vhost's DDS Security ``permissionsDocument`` (signed XML), see ``.dds``.

The core calls :class:`TopicAuthorizer` (``GroupSettings.topics``, None when no model applies).
No I/O, no clock.
"""

from amqp_policy_proxy.policy.topics.authorizer import DDS, TopicAuthorizer
from amqp_policy_proxy.policy.topics.outcomes import (
    PERSISTENT,
    PUBLISH,
    SUBSCRIBE,
    DeliveryDecision,
    Principal,
    TopicDecision,
    qos_of,
)

__all__ = [
    "DDS",
    "PERSISTENT",
    "PUBLISH",
    "SUBSCRIBE",
    "DeliveryDecision",
    "Principal",
    "TopicAuthorizer",
    "TopicDecision",
    "qos_of",
]
