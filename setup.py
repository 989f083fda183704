"""Build of the optional C extension (everything else is in pyproject.toml).

``amqp_policy_proxy.amqp._relayscan`` speeds up the proxy's relay of small messages; it is
``optional``, so an install without a C compiler succeeds and the proxy runs the same
pure-Python code (``amqp_policy_proxy.amqp.accel``).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "amqp_policy_proxy.amqp._relayscan",
            ["src/amqp_policy_proxy/amqp/_relayscan.c"],
            optional=True,
        )
    ]
)
