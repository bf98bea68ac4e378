"""``python -m memstream``: the same as the ``memstream`` command."""

from memstream.infra.cli.main import main

main()
