"""The recommendation rule of ``report capacity``: ``--percentile`` and ``--headroom``. No Spark.

``recommended = min(65535, max(1, ceil(percentile * factor)))``: the ``percentile`` (P, 0 < P
<= 100, nearest rank) of a key's per-bucket peaks over the window times the headroom
``factor``. Parsed by the job before Spark starts (a bad value is exit code 2); applied by
:mod:`.advice`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

#: Default headroom factor and percentile of the rule.
DEFAULT_FACTOR = 1.25
DEFAULT_PERCENTILE = "99.9"


class RuleError(ValueError):
    """A ``--headroom`` or ``--percentile`` value out of range; ``str()`` says which."""


@dataclass(frozen=True)
class Rule:
    """How a limit is recommended: the ``percentile`` of the samples times ``factor``."""

    percentile: Decimal = Decimal(DEFAULT_PERCENTILE)
    """P, 0 < P <= 100 (exact decimal: 99.9 is not a float here)."""
    factor: float = DEFAULT_FACTOR
    """The headroom factor, > 0."""

    @staticmethod
    def parse(percentile: str, factor: str) -> Rule:
        """Build a rule from the command line values.

        Raises:
            RuleError: ``percentile`` not in (0, 100] or ``factor`` not a positive number.
        """
        try:
            p = Decimal(percentile.strip())
        except InvalidOperation:
            raise RuleError(f"--percentile must be a number in (0, 100]: {percentile!r}") \
                from None
        if not (p.is_finite() and 0 < p <= 100):
            raise RuleError(f"--percentile must be a number in (0, 100]: {percentile!r}")
        try:
            f = float(factor)
        except ValueError:
            raise RuleError(f"--headroom must be a positive number: {factor!r}") from None
        if not (math.isfinite(f) and f > 0):
            raise RuleError(f"--headroom must be a positive number: {factor!r}")
        return Rule(p, f)

    def rank(self, n: int) -> int:
        """The 1-based nearest rank of the percentile among ``n`` sorted samples (exact)."""
        return max(1, math.ceil(self.percentile * n / 100))

    def text(self, unit: str = "per-bucket peak") -> str:
        """The rule in words, e.g. ``ceil(p99.9 of the per-bucket peak x 1.25)``."""
        return f"ceil(p{self.percentile.normalize():f} of the {unit} x {self.factor:g})"
