"""`python -m amqp_policy_proxy` runs the command-line interface."""

from amqp_policy_proxy.cli import main

raise SystemExit(main())
