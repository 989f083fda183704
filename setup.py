"""Build of the C extension (everything else is in pyproject.toml).

``amqp_policy_proxy.amqp._relayscan`` speeds up the proxy's relay of small messages. It is
built with ``-Wall -Wextra -Werror``. By default it is ``optional``: an install without a C
compiler (or whose compiler warns) succeeds and the proxy runs the same pure-Python code
(``amqp_policy_proxy.amqp.accel``). With the environment variable
``AMQP_PROXY_REQUIRE_ACCEL`` set to anything but ``""`` or ``0`` (CI sets it in ``.ci/run``)
a missing or failed build is an error: the install fails, saying why.
"""

import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

#: Environment variable that makes the extension required.
REQUIRE_ENV = "AMQP_PROXY_REQUIRE_ACCEL"
REQUIRED = os.environ.get(REQUIRE_ENV, "") not in ("", "0")
WARNINGS = ["-Wall", "-Wextra", "-Werror"]


class BuildExt(build_ext):
    """build_ext that says why the build failed when the extension is required."""

    def build_extension(self, ext):
        """Build ``ext``; a failure of a required build is reported with its cause."""
        try:
            super().build_extension(ext)
        except Exception as exc:
            if not ext.optional:
                print(f"error: {REQUIRE_ENV} is set and the C extension {ext.name} did not "
                      f"build: {exc}", file=sys.stderr)
            raise


setup(
    cmdclass={"build_ext": BuildExt},
    ext_modules=[
        Extension(
            "amqp_policy_proxy.amqp._relayscan",
            ["src/amqp_policy_proxy/amqp/_relayscan.c"],
            extra_compile_args=WARNINGS,
            optional=not REQUIRED,
        )
    ],
)
